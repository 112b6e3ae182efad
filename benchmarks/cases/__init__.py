"""The cases of ``python -m benchmarks``, one file each, named as ``--list`` names them.

In the order a full run takes them: the ceilings first (cheap, and the other cases'
floors come from the same measurements), then the per-call case, the size sweep, the
peer comparisons, the metrics, the kernels without Python, the graded loss, the trainer's
step against the batch size and the sentence-transformers in-batch loss; last the training
quality of the losses on human judgments (a study of its own, the ``quality`` package beside
this one, run as this case).
"""
from quality import study as quality

from . import (cpu_kernels, floors, isa, loss_scale, memory_bank, metrics, percall, pml_smooth_ap, scale, slate,
               st_inbatch, sweep)

CASES = {case.name: case for case in (floors.CASE, percall.CASE, sweep.CASE, slate.CASE,
                                      pml_smooth_ap.CASE, memory_bank.CASE, metrics.CASE, cpu_kernels.CASE,
                                      loss_scale.CASE, scale.CASE, st_inbatch.CASE, isa.CASE, quality.CASE)}
