"""fastrank.distributed: LocalLoss over 2 real gloo processes on CPU.

Checks the documented convention: the ranks' LocalLoss values sum to the single-process
loss of the full batch, the gradients that reach each rank's local embeddings are the
single-process gradients of its slice, and under DDP ``(loss * world_size).backward()``
gives the single-process parameter gradient.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import _gloo
import fastrank
import fastrank.nn as fnn
from fastrank.distributed import LocalLoss, all_gather_with_grad, local_contrastive_smooth_ndcg_loss

W = 2          # world size
B = 3          # images per rank
D = 5
D64 = torch.float64

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")


def make_data():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(W * B, D, generator=g, dtype=D64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(W * B, D, generator=g, dtype=D64), dim=1)
    cap = torch.nn.functional.normalize(torch.randn(W * 2 * B, D, generator=g, dtype=D64), dim=1)
    rel = torch.rand(W * B, W * B, generator=g, dtype=D64)
    rel.fill_diagonal_(1.0)
    # 2 captions per image: caption c belongs to image c // 2
    pos2 = torch.arange(W * B).unsqueeze(1) == (torch.arange(W * 2 * B) // 2).unsqueeze(0)
    return img, txt, cap, rel, pos2


class Encoder(torch.nn.Module):
    """A shared linear map for images and captions (a stand-in for two towers)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(D, D).double()

    def forward(self, img, txt):
        return self.lin(img), self.lin(txt)


def cases():
    """name -> (LocalLoss, full-batch loss(img, txt), images, captions, relevance, positives)."""
    img, txt, cap, rel, pos2 = make_data()
    top = fastrank.TopKRelevance.from_dense(rel, 2)
    scale = lambda a, b: 10.0 * a @ b.t()  # noqa: E731
    return {
        "triplet_mean": (LocalLoss(fastrank.triplet_loss, margin=0.2),
                         lambda i, t: fastrank.triplet_loss(i @ t.t(), margin=0.2), img, txt, None, None),
        "triplet_soft_sum_2caps": (
            LocalLoss(fastrank.triplet_loss, mining="soft", gamma=5.0, reduction="sum"),
            lambda i, t: fastrank.triplet_loss(i @ t.t(), mining="soft", gamma=5.0, positives=pos2,
                                               reduction="sum"), img, cap, None, pos2),
        "triplet_module_t2i": (LocalLoss(fnn.TripletLoss(mining="all", direction="t2i")),
                               lambda i, t: fastrank.triplet_loss(i @ t.t(), mining="all", direction="t2i"),
                               img, txt, None, None),
        "smooth_ndcg_mean": (LocalLoss(fastrank.smooth_ndcg_loss, tau=0.1),
                             lambda i, t: fastrank.smooth_ndcg_loss(i @ t.t(), rel, tau=0.1),
                             img, txt, rel, None),
        "smooth_ndcg_module_scaled": (LocalLoss(fnn.SmoothNDCGLoss(tau=0.5, reduction="sum"), sim_fn=scale),
                                      lambda i, t: fastrank.smooth_ndcg_loss(scale(i, t), rel, tau=0.5,
                                                                             reduction="sum"),
                                      img, txt, rel, None),
        "smooth_ndcg_pair_relevance": (LocalLoss(fastrank.smooth_ndcg_loss, tau=0.1, direction="i2t"),
                                       lambda i, t: fastrank.smooth_ndcg_loss(i @ t.t(), rel, tau=0.1,
                                                                              direction="i2t"),
                                       img, txt, "pair", None),
        # a TopKRelevance: each rank takes its rows and its columns of it, never the matrix
        "smooth_ndcg_topk": (LocalLoss(fastrank.smooth_ndcg_loss, tau=0.1),
                             lambda i, t: fastrank.smooth_ndcg_loss(i @ t.t(), top, tau=0.1),
                             img, txt, top, None),
        "kendall_topk_sum": (LocalLoss(fnn.KendallLoss(alpha=0.05, reduction="sum")),
                             lambda i, t: fastrank.kendall_loss(i @ t.t(), top, alpha=0.05, reduction="sum"),
                             img, txt, top, None),
        # every query has a positive here, so "mean" over the queries with one is over all
        "smooth_ap_mean_2caps": (LocalLoss(fastrank.smooth_ap_loss, tau=0.1),
                                 lambda i, t: fastrank.smooth_ap_loss(i @ t.t(), pos2, tau=0.1),
                                 img, cap, None, pos2),
        "recall_at_k_module": (LocalLoss(fnn.RecallAtKLoss(ks=(1, 2, 4), tau=0.1, tau_k=(1.0, 2.0, 4.0))),
                               lambda i, t: fastrank.recall_at_k_loss(i @ t.t(), ks=(1, 2, 4), tau=0.1,
                                                                      tau_k=(1.0, 2.0, 4.0)),
                               img, txt, None, None),
    }


#: the combined contrastive + smooth-NDCG loss from the embeddings: name -> its hyper-parameters
COMBINED = {
    "combined_info_nce_mean": {"weight": 0.7, "tau": 0.1, "block": 2},
    "combined_info_nce_i2t_sum": {"tau": 0.2, "direction": "i2t", "reduction": "sum"},
    "combined_siglip_t2i_mean": {"contrastive": "siglip", "weight": 1.5, "tau": 0.1, "direction": "t2i"},
    "combined_siglip_sum": {"contrastive": "siglip", "tau": 0.3, "reduction": "sum", "block": 1},
}


def combined_inputs(hyper):
    """img, txt, the TopKRelevance, logit_scale and (SigLIP) logit_bias of the combined cases."""
    img, txt, _, rel, _ = make_data()
    scalars = [torch.tensor(4.0, dtype=D64)] + ([torch.tensor(-1.5, dtype=D64)]
                                                if hyper.get("contrastive") == "siglip" else [])
    return img, txt, fastrank.TopKRelevance.from_dense(rel * (rel > 0.5), 3), scalars


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    with _gloo.group(rank, port, W):
        results = {}
        _, _, _, rel, _ = make_data()
        for name, (loss, _, img, txt, relevance, positives) in cases().items():
            bi, bt = img.shape[0] // W, txt.shape[0] // W
            img_l = img[rank * bi:(rank + 1) * bi].clone().requires_grad_()
            txt_l = txt[rank * bt:(rank + 1) * bt].clone().requires_grad_()
            if isinstance(relevance, str):   # this rank's (rows, cols) pair
                relevance = (rel[rank * bi:(rank + 1) * bi], rel[:, rank * bt:(rank + 1) * bt])
            value = loss(img_l, txt_l, relevance=relevance, positives=positives)
            value.backward()
            results[name] = (value.detach(), img_l.grad, txt_l.grad)
        for name, hyper in COMBINED.items():
            img, txt, top, scalars = combined_inputs(hyper)
            leaves = [img[rank * B:(rank + 1) * B], txt[rank * B:(rank + 1) * B], *scalars]
            leaves = [x.clone().requires_grad_() for x in leaves]
            value = local_contrastive_smooth_ndcg_loss(leaves[0], leaves[1], top, *leaves[2:], **hyper)
            value.backward()
            results[name] = (value.detach(), *(x.grad for x in leaves))
        # DDP: a shared linear encoder, loss * world_size, averaged gradients
        torch.manual_seed(0)
        model = Encoder()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        img, txt, _, _, _ = make_data()
        local = LocalLoss(fastrank.triplet_loss)
        loss = local(*ddp(img[rank * B:(rank + 1) * B], txt[rank * B:(rank + 1) * B]))
        (loss * dist.get_world_size()).backward()
        results["ddp"] = [p.grad.clone() for p in model.parameters()]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    _gloo.spawn(_worker, (_gloo.free_port(), str(out)), W)
    return [torch.load(out / f"rank{r}.pt") for r in range(W)]


@pytest.mark.parametrize("name", list(cases()))
def test_local_loss_sums_to_full_batch_loss_and_gradients(rank_results, name):
    _, full_fn, img, txt, _, _ = cases()[name]
    img = img.clone().requires_grad_()
    txt = txt.clone().requires_grad_()
    full = full_fn(img, txt)
    g_img, g_txt = torch.autograd.grad(full, (img, txt))
    total = sum(rank_results[r][name][0] for r in range(W))
    torch.testing.assert_close(total, full.detach())
    # each rank's local gradient is the single-process gradient of its slice
    torch.testing.assert_close(torch.cat([rank_results[r][name][1] for r in range(W)]), g_img)
    torch.testing.assert_close(torch.cat([rank_results[r][name][2] for r in range(W)]), g_txt)


@pytest.mark.parametrize("name", list(COMBINED))
def test_local_combined_loss_sums_to_the_single_process_loss(rank_results, name):
    """The combined contrastive + smooth-NDCG loss from the embeddings: the ranks' values sum to
    the single-process loss of the gathered batch, their embeddings get its gradient, and the
    logit scale's (and bias's) shares sum to its gradient (float64)."""
    hyper = COMBINED[name]
    img, txt, top, scalars = combined_inputs(hyper)
    leaves = [x.clone().requires_grad_() for x in (img, txt, *scalars)]
    full = fastrank.contrastive_smooth_ndcg_loss_from_embeddings(leaves[0], leaves[1], top, *leaves[2:], **hyper)
    grads = torch.autograd.grad(full, leaves)
    ranks = [rank_results[r][name] for r in range(W)]
    torch.testing.assert_close(sum(r[0] for r in ranks), full.detach(), rtol=1e-12, atol=1e-12)
    for i, want in enumerate(grads):
        got = torch.cat([r[1 + i] for r in ranks]) if i < 2 else sum(r[1 + i] for r in ranks)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_ddp_with_world_size_scaling_gives_single_process_gradient(rank_results):
    torch.manual_seed(0)
    model = Encoder()
    img, txt, _, _, _ = make_data()
    i, t = model(img, txt)
    full = fastrank.triplet_loss(i @ t.t())
    grads = torch.autograd.grad(full, list(model.parameters()))
    for r in range(W):   # DDP leaves the same averaged gradient on every rank
        for got, exp in zip(rank_results[r]["ddp"], grads):
            torch.testing.assert_close(got, exp)


def test_single_process_is_the_plain_loss():
    assert not dist.is_initialized()
    img, txt, _, rel, _ = make_data()
    x = img.clone().requires_grad_()
    assert all_gather_with_grad(x) is x
    torch.testing.assert_close(LocalLoss(fastrank.triplet_loss, reduction="none")(img, txt),
                               fastrank.triplet_loss(img @ txt.t(), reduction="none"))
    torch.testing.assert_close(LocalLoss(fnn.SmoothNDCGLoss(tau=0.2))(img, txt, relevance=rel),
                               fastrank.smooth_ndcg_loss(img @ txt.t(), rel, tau=0.2))
    top = fastrank.TopKRelevance.from_dense(rel, 3)
    torch.testing.assert_close(LocalLoss(fnn.SmoothNDCGLoss(tau=0.2))(img, txt, relevance=top),
                               fastrank.smooth_ndcg_loss(img @ txt.t(), top.to_dense(), tau=0.2))


def test_local_loss_bad_input():
    img, txt, cap, rel, _ = make_data()
    with pytest.raises(ValueError, match="relevance"):
        LocalLoss(fastrank.smooth_ndcg_loss)(img, txt)
    with pytest.raises(ValueError, match="relevance"):
        LocalLoss(fastrank.smooth_ndcg_loss)(img, txt, relevance=rel[:2])
    with pytest.raises(ValueError, match=r"relevance must have the global shape \(N, M\) = \(6, 6\)"):
        LocalLoss(fastrank.smooth_ndcg_loss)(img, txt, relevance=fastrank.TopKRelevance.from_dense(rel[:2], 2))
    with pytest.raises(TypeError, match="relevance must be a torch.Tensor, a TopKRelevance"):
        LocalLoss(fastrank.smooth_ndcg_loss)(img, txt, relevance=0.5)
    with pytest.raises(ValueError, match="positives"):
        LocalLoss(fastrank.triplet_loss)(img, cap)          # 1 image : 2 captions, no positives
    with pytest.raises(ValueError, match="direction"):
        LocalLoss(fastrank.triplet_loss, direction="up")
    with pytest.raises(ValueError, match="module"):
        LocalLoss(fnn.TripletLoss(), margin=0.1)
    with pytest.raises(ValueError, match="direction= and reduction="):
        LocalLoss(lambda sim: sim.sum())
    with pytest.raises(ValueError, match="img_local"):
        LocalLoss(fastrank.triplet_loss)(img[0], txt)
    nan = img.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="txt_local is on meta but img_local is on cpu"):
        LocalLoss(fastrank.triplet_loss)(nan, torch.empty(txt.shape, device="meta"))
    with pytest.raises(ValueError, match="^img_local contains NaN"):
        LocalLoss(fastrank.triplet_loss)(nan, txt)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_local_combined_loss_bad_input():
    """Without a process group it is the single-process loss; bad input names the argument."""
    img, txt, top, (scale,) = combined_inputs({})
    torch.testing.assert_close(local_contrastive_smooth_ndcg_loss(img, txt, top, scale, block=4),
                               fastrank.contrastive_smooth_ndcg_loss_from_embeddings(img, txt, top, scale),
                               rtol=1e-14, atol=1e-14)
    with pytest.raises(ValueError, match="^txt_local must hold as many captions"):
        local_contrastive_smooth_ndcg_loss(img, txt[1:], top, scale)
    with pytest.raises(ValueError, match="^reduction"):
        local_contrastive_smooth_ndcg_loss(img, txt, top, scale, reduction="none")
    with pytest.raises(TypeError, match="^relevance must be a fastrank.TopKRelevance"):
        local_contrastive_smooth_ndcg_loss(img, txt, top.to_dense(), scale)
    with pytest.raises(ValueError, match="^logit_bias must be given"):
        local_contrastive_smooth_ndcg_loss(img, txt, top, scale, contrastive="siglip")


HUNG_RANK_TEST = """
import os, sys, time
import pytest
import _gloo


def _hang(rank, port, pids):
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\\n")
    with _gloo.group(rank, port, 2):
        if rank == 1:
            time.sleep(3600)


@pytest.mark.timeout(30)   # ample for two ranks to start (import torch: 6 s quiet) and meet, on a loaded machine
def test_hung():
    _gloo.spawn(_hang, (_gloo.free_port(), sys.argv[-1] + ".pids"), 2)
"""


@pytest.mark.slow  # waits out a test timeout by design
def test_a_hung_rank_is_ended_by_the_test_timeout_with_its_stack(tmp_path):
    """A rank that never finishes fails its test at the run's timeout (pytest-timeout), prints
    every thread's stack, and does not outlive the test: no test measures time itself."""
    test = tmp_path / "test_hung_rank.py"
    test.write_text(HUNG_RANK_TEST)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(test)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Timeout" in out and "1 failed" in out, out[-3000:]
    assert "in _hang" in out, out[-3000:]   # the hung rank's stack, printed on the way out
    pids = [int(p) for p in (tmp_path / "test_hung_rank.py.pids").read_text().split()]
    assert len(pids) == 2
    for pid in pids:   # neither rank outlived its test
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
