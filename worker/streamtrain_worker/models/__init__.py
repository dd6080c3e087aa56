"""The model zoo: dense networks on top of the PS-backed embedding, behind a registry.

Every model maps the pooled slot embeddings ``(B, S, W)`` (and, for DIN, the unpooled
behaviour-sequence embeddings) to one logit per example, so the inference export starts
right after the embedding layer. Importing this package registers the built-in models.
"""

from streamtrain_worker.models.base import DenseModel, ModelSpec, build_model, register, registered
from streamtrain_worker.models.deepfm import DeepFM
from streamtrain_worker.models.din import DIN
from streamtrain_worker.models.slot_dnn import SlotDNN
from streamtrain_worker.models.wide_deep import WideDeep

__all__ = [
    "DIN",
    "DeepFM",
    "DenseModel",
    "ModelSpec",
    "SlotDNN",
    "WideDeep",
    "build_model",
    "register",
    "registered",
]
