"""The ``finetune`` switch of an encoder around a pretrained model (the Hugging Face encoders,
``sbert``): frozen, the model is always in eval mode (``train()`` included) and gets no gradient;
``finetune=True`` trains it with the rest."""
from __future__ import annotations

from torch import nn


class FinetuneSwitch(nn.Module):
    """Base of an encoder whose pretrained model is its attribute named ``_pretrained``."""

    _pretrained = "model"

    def _set_finetune(self, finetune) -> None:
        if not isinstance(finetune, bool):
            raise TypeError(f"finetune must be True or False, got {finetune!r}")
        self.finetune = finetune
        model = getattr(self, self._pretrained)
        model.requires_grad_(finetune)
        if not finetune:
            model.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.finetune:
            getattr(self, self._pretrained).eval()
        return self
