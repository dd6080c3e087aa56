"""Ordinal slots: which slots are ordinal, their values read back from the keys, the
model input they become, and the export and predictor that carry them."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.config import AVAZU_SLOTS, DataConfig
from streamtrain_worker.data.formats import make_format
from streamtrain_worker.data.hashing import feature_signs, feature_values
from streamtrain_worker.data.ordinal import ordinal_inputs
from streamtrain_worker.data.reader import PassReader
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.publishing.export import describe, export_dense, load_dense, script
from streamtrain_worker.publishing.predict import LoadedModel, SparseModel, score
from streamtrain_worker.training.train import Trainer

from .conftest import MISSING, parse, run, worker_config

U64 = (1 << 64) - 1


def test_values_come_back_from_the_signs_exactly() -> None:
    """Negative buckets (two's complement), the missing-value token and any 64-bit value."""
    values = np.array([0, 1, 2, -1 & U64, -64 & U64, 3, 191, MISSING, U64], dtype=np.uint64)
    slots = np.arange(values.shape[0]) % 4
    assert feature_values(slots, feature_signs(slots, values)).tolist() == values.tolist()
    # the slot is part of the sign: read in another slot, a sign gives another value
    other = feature_values(slots + 1, feature_signs(slots, values))
    assert not np.any(other == values)
    with pytest.raises(ValueError, match="differ in shape"):
        feature_values(slots[:2], values)


def test_criteo_integer_columns_become_bucket_numbers_and_missing_flags() -> None:
    # I1 empty, I2 -5, I3 -100 (clamped to -64), I4 2, I5 1000, I6..I13 7; C1..C26 text
    cells = ["", "-5", "-100", "2", "1000"] + ["7"] * 8 + ["68fd1e64"] * 26
    line = "\t".join(["1", *cells]) + "\n"
    cfg = DataConfig.from_dict({"format": "criteo"})
    batch = parse(make_format(cfg), (line * 2).encode()).batch
    out = ordinal_inputs(batch, cfg.ordinal_slots)
    assert out.shape == (2, 13, 2) and out.dtype == np.float32
    bucket_7 = 3 + int(math.log(7) ** 2)
    expected_values = [0, -5, -64, 2, 3 + int(math.log(1000) ** 2)] + [bucket_7] * 8
    assert out[0, :, 0].tolist() == expected_values
    assert out[0, :, 1].tolist() == [1.0] + [0.0] * 12
    np.testing.assert_array_equal(out[0], out[1])
    # the slot order asked for is the column order; categorical slots are never read
    assert ordinal_inputs(batch, (4, 1))[0, :, 0].tolist() == [expected_values[4], -5]


def test_several_tokens_average_and_empty_or_foreign_bags_are_missing() -> None:
    # 2 examples x 2 slots: slot 1 holds [4, 8] then nothing; slot 0 holds MISSING then 3
    keys = [(0, MISSING), (1, 4), (1, 8), (0, 3)]
    slots = np.array([s for s, _ in keys])
    signs = feature_signs(slots, np.array([v for _, v in keys], dtype=np.uint64))
    batch = Batch(
        labels=np.zeros(2, np.float32),
        keys=signs,
        offsets=np.array([0, 1, 3, 4, 4], dtype=np.int64),
        num_slots=2,
    )
    out = ordinal_inputs(batch, (0, 1))
    assert out.tolist() == [[[0.0, 1.0], [6.0, 0.0]], [[3.0, 0.0], [0.0, 1.0]]]
    # a key no parser made (a synthetic one) decodes to some huge integer: missing, not 1e18
    made_up = dataclasses.replace(batch, keys=np.array([5, 6, 7, 8], dtype=np.uint64))
    assert ordinal_inputs(made_up, (0, 1))[:, :, 1].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert ordinal_inputs(batch, ()).shape == (2, 0, 2)
    with pytest.raises(ValueError, match="not all in"):
        ordinal_inputs(batch, (2,))


def test_the_format_layout_declares_the_ordinal_slots() -> None:
    assert DataConfig.from_dict({"format": "criteo"}).ordinal_slots == tuple(range(13))
    avazu = DataConfig.from_dict({"format": "avazu"}).ordinal_slots
    assert avazu == (AVAZU_SLOTS.index("hour"), AVAZU_SLOTS.index("weekday"))
    csv = DataConfig.from_dict(
        {
            "format": "csv",
            "columns": {
                "click": "label",
                "user": "user",
                "age": {"slot": "age", "kind": "bucket"},
                # a slot fed by a bucket and a categorical column is not ordinal
                "a": {"slot": "mixed", "kind": "bucket"},
                "b": "mixed",
                "visits": {"slot": "visits", "kind": "bucket"},
            },
        }
    )
    assert csv.slot_names == ("user", "age", "mixed", "visits")
    assert csv.ordinal_slots == (1, 3)
    assert DataConfig.from_dict({"format": "slot", "numSlots": 3}).ordinal_slots == ()


def test_only_slot_dnn_with_the_switch_on_takes_ordinal_inputs() -> None:
    on = worker_config().model
    assert ModelSpec.from_config(on, 39, None, (0, 1)).ordinal_slots == (0, 1)
    off = dataclasses.replace(on, ordinalInputs=False)
    assert ModelSpec.from_config(off, 39, None, (0, 1)).ordinal_slots == ()
    deepfm = dataclasses.replace(on, type="deepfm")
    assert ModelSpec.from_config(deepfm, 39, None, (0, 1)).ordinal_slots == ()


def test_slot_dnn_reads_the_ordinal_inputs_and_scripts() -> None:
    spec = ModelSpec(
        num_slots=3, embedding_dim=2, cvm=True, hidden_units=(8,), ordinal_slots=(0, 2)
    )
    model = build_model("slot_dnn", spec, seed=1)
    g = torch.Generator().manual_seed(0)
    pooled = torch.randn(5, 3, spec.slot_width, generator=g)
    ordinal = torch.randn(5, 2, 2, generator=g)
    logits = model(pooled, None, None, ordinal)
    assert logits.shape == (5,)
    # the data norm of the ordinal columns accumulates their statistics like the CVM's
    pending = model.ordinal_norm[0].pending.reshape(3, -1)
    assert pending[0].tolist() == [5.0] * 4
    torch.testing.assert_close(pending[1], ordinal.flatten(1).sum(0))
    # the inputs reach the MLP (different values, different logits) and its first layer
    # gets a gradient from them
    assert not torch.allclose(logits, model(pooled, None, None, ordinal + 1.0))
    logits.sum().backward()
    first = model.mlp[0].weight.grad
    assert first is not None and first[:, -4:].abs().sum() > 0
    with pytest.raises(ValueError, match="pass ordinal"):
        model(pooled)
    scripted = script(model.eval())
    with torch.no_grad():
        torch.testing.assert_close(
            scripted(pooled, None, None, ordinal), model(pooled, None, None, ordinal)
        )
    inputs = describe(model, "slot_dnn")["inputs"]
    assert inputs[-1]["name"] == "ordinal" and inputs[-1]["slots"] == [0, 2]


def test_the_predictor_scores_like_an_evaluate_only_pass(
    chunks: list[str],
    tmp_path: Path,
) -> None:
    """Trained on Criteo (13 ordinal slots), exported, then scored by the predictor on
    the same model state: the ordinal inputs are rebuilt from the keys alike."""
    cfg = worker_config()
    ps = LocalPS(cfg.ps.config)
    trainer = Trainer(cfg, ps, cfg.data.num_slots)
    try:
        run(trainer, chunks[:2])
        trainer.sync_dense()
        export_dense(trainer.model, cfg.model.type, str(tmp_path / "dense"))
        dense, meta = load_dense(str(tmp_path / "dense"))
        assert meta["ordinalSlots"] == list(range(13))
        with PassReader(chunks[2:3], cfg.data, 512) as reader:
            keys = np.unique(np.concatenate([b.keys for b in reader]))
        evaluated = run(trainer, chunks[2:3], train=False)
    finally:
        trainer.close()
    sparse = SparseModel(keys, ps.pull_sparse(cfg.table, keys))
    loaded = LoadedModel("m", ["m"], sparse, dense, meta, cfg.data, cfg.table, 4096)
    predicted = score(loaded, chunks[2:3])
    assert predicted.examples == evaluated.examples == 1200
    assert predicted.auc == pytest.approx(evaluated.auc, abs=1e-6)
    assert predicted.loss == pytest.approx(evaluated.loss, abs=1e-5)
    # without the ordinal inputs the export would predict something else
    no_ordinal = dict(meta, ordinalSlots=[])
    with pytest.raises(torch.jit.Error, match="pass ordinal"):
        score(dataclasses.replace(loaded, meta=no_ordinal), chunks[2:3])
