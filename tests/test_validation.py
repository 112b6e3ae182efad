"""src/fastrank/_validation.py: the hyper-parameter helpers every public function shares
(docs/spec.md §1: any real number, rejected only when out of range or not a number, with the
argument and the type named) and the one-pass value checks."""
import fractions
import math

import numpy as np
import pytest
import torch

from fastrank import _validation as V

REALS = [0.25, 1, np.float32(0.25), np.float64(0.25), np.int64(1), np.array(0.25), torch.tensor(0.25),
         torch.tensor(0.25, dtype=torch.float64), torch.tensor(1), torch.tensor(0.25).requires_grad_(),
         fractions.Fraction(1, 4)]


@pytest.mark.parametrize("value", REALS, ids=repr)
def test_real_numbers_are_accepted_as_python_floats(value):
    plain = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
    for check in (V.check_positive, V.check_nonnegative, V.check_real):
        x = check(value, "tau")
        assert type(x) is float and x == plain


@pytest.mark.parametrize("value,kind", [
    ("0.1", "(str)"), (True, "(bool)"), (np.bool_(True), "(numpy.bool"), (None, "(NoneType)"),
    (1 + 2j, "(complex)"), (torch.tensor(0.1 + 0j), "complex64"), (torch.tensor(True), "torch.bool"),
    (torch.tensor([0.1]), "tensor of shape (1,)"), (np.array([0.1, 0.2]), "numpy float64 array of shape (2,)"),
    ([0.1], "(list)"), (torch.empty((), device="meta"), "torch.float32 tensor of shape ()"),
])
def test_not_a_number_names_argument_and_type(value, kind):
    with pytest.raises(ValueError, match=r"^tau must be a real number \(int, float, numpy scalar or 0-d tensor\)") as info:
        V.check_positive(value, "tau")
    assert kind in str(info.value)


@pytest.mark.parametrize("value,msg", [
    (0.0, "tau must be a finite number > 0, got 0.0"),
    (-1, "tau must be a finite number > 0, got -1"),
    (float("nan"), "tau must be a finite number > 0, got nan"),
    (float("inf"), "tau must be a finite number > 0, got inf"),
    (10 ** 400, "tau must be a finite number > 0, got 1000"),
    (torch.tensor(0.0), "tau must be a finite number > 0, got 0.0 (a 0-d torch.float32 tensor)"),
    (np.float32(-2.0), "tau must be a finite number > 0, got np.float32(-2.0) (numpy.float32)"),
])
def test_out_of_range_names_the_range_and_the_type(value, msg):
    with pytest.raises(ValueError) as info:
        V.check_positive(value, "tau")
    assert str(info.value).startswith(msg), str(info.value)


def test_nonnegative_and_real_ranges():
    assert V.check_nonnegative(torch.tensor(0.0), "margin") == 0.0
    with pytest.raises(ValueError, match=r"margin must be a finite number >= 0, got -0.5 \(a 0-d torch.float64"):
        V.check_nonnegative(torch.tensor(-0.5, dtype=torch.float64), "margin")
    assert V.check_real(np.float64(-3.5), "thresholds[0]") == -3.5
    with pytest.raises(ValueError, match=r"thresholds\[0\] must be a finite number"):
        V.check_real(np.float64("inf"), "thresholds[0]")


@pytest.mark.parametrize("value", [5, np.int64(5), np.int32(5), np.uint8(5), torch.tensor(5), np.array(5),
                                   torch.tensor(5, dtype=torch.int16)], ids=repr)
def test_integers(value):
    k = V.check_int(value, "k")
    assert type(k) is int and k == 5


@pytest.mark.parametrize("value,kind", [(5.0, "(float)"), (torch.tensor(5.0), "0-d torch.float32 tensor"),
                                        (np.float64(5.0), "numpy.float64"), (True, "(bool)"), ("5", "(str)"),
                                        (torch.tensor([5]), "tensor of shape (1,)")])
def test_not_an_integer(value, kind):
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1 \(int, numpy integer or 0-d integer tensor\)") \
            as info:
        V.check_int(value, "k")
    assert kind in str(info.value)
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1, got 0 \(a 0-d torch.int64 tensor\)"):
        V.check_int(torch.tensor(0), "k")


def test_sequences_for_ks_and_tau_k():
    """The helpers the set-retrieval losses use: ks=(1, 2, 4, 8, 16), tau_k one number or
    one per k."""
    ks = V.check_sequence((1, np.int64(2), torch.tensor(4)), "ks", V.check_int)
    assert ks == (1, 2, 4) and all(type(k) is int for k in ks)
    assert V.check_sequence(torch.tensor([1, 2]), "ks", V.check_int) == (1, 2)
    assert V.check_sequence(np.array([8, 16]), "ks", V.check_int) == (8, 16)
    assert V.check_sequence(range(1, 4), "ks", V.check_int) == (1, 2, 3)
    assert V.check_sequence(3, "ks", V.check_int, scalar=True) == (3,)
    assert V.check_sequence(torch.tensor(0.5), "tau_k", scalar=True, length=3) == (0.5, 0.5, 0.5)
    assert V.check_sequence([0.5, np.float32(1.0), 2], "tau_k", scalar=True, length=3) == (0.5, 1.0, 2.0)
    assert V.check_sequence((), "thresholds", V.check_real, nonempty=False) == ()
    with pytest.raises(ValueError, match=r"^ks\[1\] must be an integer >= 1, got 0"):
        V.check_sequence((1, 0), "ks", V.check_int)
    with pytest.raises(ValueError, match=r"^ks must not be empty"):
        V.check_sequence((), "ks", V.check_int)
    with pytest.raises(ValueError, match=r"^ks must be a tuple or list of numbers, got 3 \(int\)"):
        V.check_sequence(3, "ks", V.check_int)
    with pytest.raises(ValueError, match=r"^tau_k must have 3 entries \(or be one number\), got 2"):
        V.check_sequence((1.0, 2.0), "tau_k", scalar=True, length=3)
    with pytest.raises(ValueError, match=r"^tau_k\[1\] must be a finite number > 0, got -1.0"):
        V.check_sequence((1.0, -1.0), "tau_k", scalar=True, length=2)
    with pytest.raises(ValueError, match=r"^tau_k must be a finite number > 0"):
        V.check_sequence(0.0, "tau_k", scalar=True, length=2)
    with pytest.raises(ValueError, match=r"^tau_k must be a number or a sequence of numbers, got '1' \(str\)"):
        V.check_sequence("1", "tau_k", scalar=True)


def test_pairs_and_intervals_accept_arrays_and_tensors():
    assert V.check_pair(np.array([25.0, 20.0]), "gamma") == (25.0, 20.0)
    assert V.check_pair((torch.tensor(1.0), np.float32(2.0)), "gamma") == (1.0, 2.0)
    assert V.check_interval(torch.tensor([-1.0, 1.0]), "label_range") == (-1.0, 1.0)
    with pytest.raises(ValueError, match=r"^gamma must be a pair of numbers, got 25.0 \(float\)"):
        V.check_pair(25.0, "gamma")
    with pytest.raises(ValueError, match=r"^label_range must satisfy lo < hi"):
        V.check_interval(np.array([1.0, 0.0]), "label_range")


def test_relevance_values_one_pass():
    r = torch.tensor([[0.0, 0.5], [1.0, 0.25]])
    V.check_relevance_values(r, minimum=0.0)
    V.check_relevance_values(r, label_range=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"^relevance must be >= 0 for smooth_ndcg_loss, got a minimum of -0.5; .*\(1 \+ c\) / 2"):
        V.check_relevance_values(r - 0.5, minimum=0.0, loss="smooth_ndcg_loss")
    with pytest.raises(ValueError, match=r"^relevance must lie in label_range \[0, 1\].* values in \[0.5, 1.5\]"):
        V.check_relevance_values(r + 0.5, label_range=(0.0, 1.0))
    nan = r.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="^relevance contains NaN"):   # NaN wins over the range
        V.check_relevance_values(nan - 5, minimum=0.0)
    assert V.value_range(r) == (0.0, 1.0)
    assert math.isnan(V.value_range(nan)[0])


def test_check_data_reads_nothing_where_the_check_is_off(monkeypatch):
    bad = torch.full((2, 2), float("nan"))
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    V.check_data(bad, bad - 1, relevance_min=0.0)
    V.check_data(torch.empty(2, 2, device="meta"), torch.empty(2, 2, device="meta"), relevance_min=0.0)
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "1")
    with pytest.raises(ValueError, match="^sim contains NaN"):
        V.check_data(bad, None)
    with pytest.raises(ValueError, match="^relevance must be >= 0"):
        V.check_data(torch.zeros(2, 2), torch.full((2, 2), -1.0), relevance_min=0.0)
