"""Placeholder: being implemented."""


def fast_rerank(*args, **kwargs):
    raise NotImplementedError("fast_rerank is not implemented yet")


class FastRerank:  # placeholder
    def __init__(self, *a, **k):
        raise NotImplementedError
