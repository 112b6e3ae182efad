"""The contract every native op keeps, run over the registry (src/fastrank/ops/registry.py):

- ``torch.library.opcheck`` on each of its custom ops (schema, fake tensor, autograd
  registration, AOT dispatch), on the registry's example inputs;
- ``torch.compile(fullgraph=True)`` of the functional form equals eager, values and gradients;
- float64 ``gradcheck`` (or, for an op without a gradient, outputs that need none);
- determinism: two calls are bit-identical, values and gradients, at a size the kernels
  split across threads;
- the ``nn.Module`` form equals the functional form, bit for bit;
- bad input raises the registry's ValueError/TypeError, with a message that starts with the
  argument's name, from the functional and the module form;
- completeness: every custom op registered under ``fastrank`` (torch.ops.fastrank.*) is in
  some entry, so a new op cannot skip the contract.

The per-op files (tests/test_<op>.py) test each op's mathematics against its reference and
loop oracles; this file is the part every op shares.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

import fastrank
from fastrank.ops.registry import LOSSES, NATIVE_OPS, functional_names, module_names

NATIVE_CPU = fastrank.backends()["cpu"]
REQUIRE_NATIVE = os.environ.get("FASTRANK_REQUIRE_NATIVE") == "1"
# every example calls impl="native": without the module that is an error, reported as a
# failure where the native build is required and as a skip elsewhere
needs_kernel = pytest.mark.skipif(not NATIVE_CPU and not REQUIRE_NATIVE,
                                  reason="native CPU module not built (FASTRANK_REQUIRE_NATIVE=1: a failure)")

EXAMPLES = [pytest.param(op, i, id=f"{name}-{ex.name}")
            for name, op in NATIVE_OPS.items() for i, ex in enumerate(op.examples(torch.float32))]
BAD = [pytest.param(op, bad, id=f"{name}-{bad.about}") for name, op in NATIVE_OPS.items() for bad in op.bad_inputs]
WITH_MODULE = [pytest.param(op, i, id=f"{name}-{ex.name}")
               for name, op in NATIVE_OPS.items() if op.module is not None
               for i, ex in enumerate(op.examples(torch.float32))]


def _tensors(out) -> list:
    """The tensors of an op's output (a tensor, a tuple, a NamedTuple with None fields)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if t is not None]


def _call(fn, ex, dtype_inputs=None):
    """(output tensors, gradients of ex.grad inputs) of ``fn(**inputs)`` after a backward of
    a fixed weighted sum of the differentiable outputs."""
    inputs = dict(dtype_inputs or ex.inputs)
    for name in ex.grad:
        inputs[name] = inputs[name].detach().clone().requires_grad_(True)
    outs = _tensors(fn(**inputs))
    diff = [o for o in outs if o.requires_grad]
    grads = []
    if ex.grad:
        assert diff, "an op with gradient inputs returned nothing differentiable"
        total = sum((o * torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in diff)
        grads = list(torch.autograd.grad(total, [inputs[n] for n in ex.grad]))
    return [o.detach() for o in outs], grads


def _functional(op, ex):
    return lambda **inputs: op.functional(**inputs, **ex.hyper)


def _example(op, i, dtype=torch.float32, **kw):
    return op.examples(dtype, **kw)[i]


# ---------------------------------------------------------------- opcheck
@needs_kernel
@pytest.mark.parametrize("op,i", EXAMPLES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_every_custom_op(op, i, dtype):
    samples = op.op_samples(_example(op, i, dtype))
    assert {name for name, _ in samples} == set(op.custom_ops), "every custom op of the entry gets a sample"
    for name, args in samples:
        namespace, op_name = name.split("::")
        torch.library.opcheck(getattr(getattr(torch.ops, namespace), op_name).default, args)


# ---------------------------------------------------------------- torch.compile
@needs_kernel
@pytest.mark.parametrize("op,i", EXAMPLES)
def test_compile_fullgraph_equals_eager(op, i):
    ex = _example(op, i, torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(_functional(op, ex), fullgraph=True, backend="aot_eager")
    got, got_grads = _call(compiled, ex)
    want, want_grads = _call(_functional(op, ex), ex)
    assert len(got) == len(want) and len(got_grads) == len(want_grads)
    for a, b in zip(got + got_grads, want + want_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- gradients
@needs_kernel
@pytest.mark.parametrize("op,i", EXAMPLES)
def test_gradcheck_float64(op, i):
    ex = _example(op, i, torch.float64)
    if not ex.grad:   # no gradient by contract: nothing the output depends on asks for one
        inputs = {k: v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor)
                  and v.dtype.is_floating_point else v for k, v in ex.inputs.items()}
        assert not any(t.requires_grad for t in _tensors(op.functional(**inputs, **ex.hyper)))
        return
    names = list(ex.grad)

    def fn(*tensors):
        return tuple(_tensors(op.functional(**{**ex.inputs, **dict(zip(names, tensors))}, **ex.hyper)))
    leaves = [ex.inputs[n].detach().clone().requires_grad_(True) for n in names]
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- determinism
@needs_kernel
@pytest.mark.parametrize("op,i", EXAMPLES)
def test_two_calls_are_bit_identical(op, i):
    ex = _example(op, i, torch.float32, seed=1, size=(97, 131))   # rows and columns split across threads
    first, first_grads = _call(_functional(op, ex), ex)
    second, second_grads = _call(_functional(op, ex), ex)
    for a, b in zip(first + first_grads, second + second_grads):
        assert a.dtype == b.dtype and torch.equal(a, b)


# ---------------------------------------------------------------- module form
@needs_kernel
@pytest.mark.parametrize("op,i", WITH_MODULE)
def test_module_form_equals_functional(op, i):
    ex = _example(op, i, torch.float32)
    module = op.module(**ex.hyper)
    assert isinstance(module, torch.nn.Module)
    got, got_grads = _call(module, ex)
    want, want_grads = _call(_functional(op, ex), ex)
    assert len(got) == len(want)
    for a, b in zip(got + got_grads, want + want_grads):
        assert torch.equal(a, b)


def test_an_op_without_module_form_says_why():
    for op in NATIVE_OPS.values():
        assert (op.module is None) == bool(op.no_module), op.name
        if op.module is not None:
            assert op.module.__name__ in fastrank.nn.__all__, f"{op.module.__name__} is not in fastrank.nn"
        assert getattr(fastrank, op.functional.__name__) is op.functional, f"fastrank.{op.functional.__name__}"


# ---------------------------------------------------------------- bad input
@needs_kernel
@pytest.mark.parametrize("op,bad", BAD)
def test_bad_input_names_the_argument(op, bad):
    ex = _example(op, 0)
    inputs = {**ex.inputs, **bad.inputs(ex.inputs)}
    hyper = {**ex.hyper, **bad.hyper}
    named = re.compile(rf"{re.escape(bad.argument)}\b")
    with pytest.raises(bad.error) as err:
        op.functional(**inputs, **hyper)
    assert named.match(str(err.value)), f"the message does not start with {bad.argument!r}: {err.value}"
    if op.module is not None:   # the constructor (hyper-parameters) or the call (tensors) says it
        with pytest.raises(bad.error) as err:
            op.module(**hyper)(**inputs)
        assert named.match(str(err.value)), f"module form: the message does not start with {bad.argument!r}"


# a bad hyper-parameter of an op with a module form
BAD_HYPER = [pytest.param(op, bad, id=f"{name}-{bad.about}") for name, op in NATIVE_OPS.items()
             for bad in op.bad_inputs if bad.hyper and op.module is not None]
# the ops with a module form: its call runs the functional's body without checking the
# hyper-parameters again (ModuleForm's `checked`)
WITH_MODULE_FORM = [name for name, op in NATIVE_OPS.items() if op.module is not None]


@needs_kernel
@pytest.mark.parametrize("op,bad", BAD_HYPER)
def test_a_module_form_checks_a_hyper_parameter_it_is_given_later(op, bad):
    """Assigning a bad hyper-parameter to a module raises as the constructor does."""
    ex = _example(op, 0)
    module = op.module(**ex.hyper)
    name, value = next(iter(bad.hyper.items()))
    with pytest.raises(bad.error) as err:
        setattr(module, name, value)
    assert re.match(rf"{re.escape(bad.argument)}\b", str(err.value)), err.value
    assert getattr(module, name) == getattr(op.module(**ex.hyper), name)  # unchanged


@needs_kernel
@pytest.mark.parametrize("name", WITH_MODULE_FORM)
def test_a_module_form_checks_its_hyper_parameters_once_not_per_call(name, monkeypatch):
    """The module checks them when they are set, with its functional's own check; its call does
    not check them again, while the functional checks them at every call."""
    op = NATIVE_OPS[name]
    ex = _example(op, 0)
    module = op.module(**ex.hyper)
    check = op.module._check_hyper
    home = sys.modules[op.functional.__module__]
    assert getattr(home, check.__name__, None) is check, \
        f"{op.module.__name__}'s check is not a function of {home.__name__} (the one its functional calls)"
    calls = []

    def counted(*hyper):
        calls.append(hyper)
        return check(*hyper)
    monkeypatch.setattr(home, check.__name__, counted)
    module(**ex.inputs)
    module(**ex.inputs)
    assert calls == [], "the module's call checked its hyper-parameters again"
    op.functional(**ex.inputs, **ex.hyper)
    op.functional(**ex.inputs, **ex.hyper)
    assert len(calls) == 2, "the functional checks them at every call, with the module's check"


# ---------------------------------------------------------------- completeness
CUSTOM_OP = re.compile(r"""(?:custom_op|define)\(\s*["'](fastrank::\w+)""")


def test_every_fastrank_custom_op_is_in_the_registry():
    covered = {name for op in NATIVE_OPS.values() for name in op.custom_ops}
    # what `import fastrank` registered with the dispatcher ...
    registered = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("fastrank::")}
    # ... and what any module of the package defines (the lazily imported ones too)
    package = Path(fastrank.__file__).resolve().parent
    defined = {m for path in package.rglob("*.py") for m in CUSTOM_OP.findall(path.read_text())}
    assert registered and defined
    missing = (registered | defined) - covered
    assert not missing, f"custom ops in no row of the table (ROWS; src/fastrank/ops/registry.py): {sorted(missing)}"
    assert covered <= registered, f"registry entries name ops that do not exist: {covered - registered}"


def test_the_completeness_check_would_see_a_new_op():
    """An op registered after import is seen by the dispatcher query above."""
    lib = torch.library.Library("fastrank_contract_probe", "FRAGMENT")
    lib.define("probe(Tensor x) -> Tensor")
    names = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("fastrank_contract_probe::")}
    assert names == {"fastrank_contract_probe::probe"}
    assert CUSTOM_OP.findall('@torch.library.custom_op("fastrank::new_op", mutates_args=())') == ["fastrank::new_op"]


def test_the_table_collects_every_public_module_s_rows(tmp_path, monkeypatch):
    """The table is the ROWS of the public modules of a package, in the order of their names;
    a private module is skipped, and a public one without ROWS is an error naming it."""
    pkg = tmp_path / "rows_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    row = "from fastrank.ops._row import Loss\ndef {0}_loss(sim): return sim.sum()\n"
    (pkg / "b.py").write_text(row.format("zeta") + "ROWS = (Loss('zeta', zeta_loss, None),)\n")
    (pkg / "a.py").write_text(row.format("beta") + row.format("alpha") +
                              "ROWS = (Loss('beta', beta_loss, None), Loss('alpha', alpha_loss, None))\n")
    (pkg / "_private.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from fastrank.ops import registry
    try:
        import rows_probe
        assert [r.name for r in registry._declared_rows((rows_probe,))] == ["alpha", "beta", "zeta"]
        (pkg / "c.py").write_text("x = 1\n")
        with pytest.raises(ImportError, match="rows_probe.c declares no ROWS"):
            registry._declared_rows((rows_probe,))
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "rows_probe"]:
            del sys.modules[name]
    # fastrank's own table: every row of it comes from the module of its functional
    for name, row in LOSSES.items():
        assert row in sys.modules[row.functional.__module__].ROWS, name


# ---------------------------------------------------------------- the table feeds the public names
def test_the_public_names_are_the_table_of_losses():
    """fastrank.__all__ and fastrank.nn.__all__ are made from the table (src/fastrank/ops/registry.py):
    they hold exactly its forms, besides the few names written out, and each name is the table's object."""
    assert set(fastrank.__all__) == {"__version__", "backends", "kernel_variant", "KernelVariant", "nn",
                                     "TopKRelevance"} | set(functional_names())
    assert set(fastrank.nn.__all__) == {"CombinedLoss"} | set(module_names())
    for row in LOSSES.values():
        assert getattr(fastrank, row.functional.__name__) is row.functional
        assert row.module is None or getattr(fastrank.nn, row.module.__name__) is row.module
