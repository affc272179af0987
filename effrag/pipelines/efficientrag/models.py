"""The loop's models: a system's checkpoints loaded for inference, and their int8 copies (``config.int8``)."""
from __future__ import annotations


def int8_copy(model):
    """A copy of ``model`` whose encoder Linear layers run int8 dynamic quantization (``config.int8``).

    Per-channel weights; the heads and the two projections that read the residual stream's outliers
    (``*.output.dense``: attention output and FFN down-projection) stay fp32: quantizing those moved
    p(<Continue>) by up to 0.3 on HotpotQA dev pairs, this keeps it within ~0.06. CPU only: on another
    device (or without PyTorch's fbgemm engine) the model itself is returned, with a warning.
    """
    import copy
    import logging
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    device = next(model.parameters()).device
    if device.type != "cpu" or "fbgemm" not in torch.backends.quantized.supported_engines:
        logging.getLogger(__name__).warning("int8 needs a CPU with the fbgemm engine; running %s as it is", device)
        return model
    q = copy.deepcopy(model)
    spec = {name: per_channel_dynamic_qconfig for name, m in q.encoder.named_modules()
            if isinstance(m, torch.nn.Linear) and not name.endswith("output.dense")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        q.encoder = quantize_dynamic(q.encoder, spec, dtype=torch.qint8)
    return q.eval()


def load_models(labeler, filter_model, device: str | None = None, ranker=None):
    """Labeler and Filter (and, when given, the pool ranker) from checkpoint directories, on ``device``
    (default: CUDA when present). Models given as objects pass through where they are. Returns
    ``(labeler, filter)``, or ``(labeler, filter, ranker)`` when ``ranker`` is given."""
    import torch

    from effrag.models import FilterModel, LabelerModel, LateRankerModel, RankerModel, load_model

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = lambda m: isinstance(m, str) or hasattr(m, "__fspath__")  # noqa: E731
    if path(labeler):
        labeler = LabelerModel.from_pretrained(labeler).to(device)
    if path(filter_model):
        filter_model = FilterModel.from_pretrained(filter_model).to(device)
    if ranker is None:
        return labeler.eval(), filter_model.eval()
    ranker_path = ranker
    if path(ranker):  # a cross-encoder (ranker) or a late-interaction one (late_ranker)
        ranker = load_model(ranker).to(device)
        if not isinstance(ranker, (RankerModel, LateRankerModel)):
            raise ValueError(f"{ranker_path}: a {type(ranker).model_type} model is not a pool ranker")
    return labeler.eval(), filter_model.eval(), ranker.eval()
