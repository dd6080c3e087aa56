"""Line formats: each turns raw bytes into ``Batch`` blocks with one numba kernel.

``make_format(config)`` picks the format named by ``DataConfig.format``; every format follows
the ``kernel.Format`` protocol and the hashing scheme of ``data.hashing``.
"""

from __future__ import annotations

from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.formats.avazu import AvazuFormat
from streamtrain_worker.data.formats.criteo import CriteoFormat
from streamtrain_worker.data.formats.generic_csv import CsvFormat
from streamtrain_worker.data.formats.kernel import REASONS, Format, ParsedBlock
from streamtrain_worker.data.formats.libsvm import LibsvmFormat
from streamtrain_worker.data.formats.slot import SlotFormat

__all__ = ["REASONS", "Format", "ParsedBlock", "make_format"]


def make_format(config: DataConfig, labels_optional: bool = False) -> Format:
    """The parser for ``config.format`` (loads the libSVM field map, if any, once).

    ``labels_optional`` (scoring, not training): a slot line without its label token is an
    example with a NaN label instead of a bad line; other formats keep the label required.
    """
    if config.format == "criteo":
        return CriteoFormat()
    if config.format == "avazu":
        return AvazuFormat(config)
    if config.format == "csv":
        return CsvFormat(config)
    if config.format == "libsvm":
        return LibsvmFormat(config)
    return SlotFormat(config, labels_optional)
