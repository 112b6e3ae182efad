"""Placeholder: being implemented."""


def fast_rerank_topk(*args, **kwargs):
    raise NotImplementedError("fast_rerank_topk is not implemented yet")
