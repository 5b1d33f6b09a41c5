"""Pipelines declared as data by their families, and what the declaration must satisfy."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from omni_backend.families import (family_module, get_pipeline, import_path, load_family, openai_default_pipeline,
                                   pipelines)
from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

AUDIO = (TensorSpec("AUDIO", "FP32", (-1,)),)
CODES = (TensorSpec("CODES", "INT64", (-1, -1)),)


def test_builtin_families_declare_their_pipelines():
    p = get_pipeline("hibari")
    assert p.family == "hibari" and family_module("hibari") == "omni_backend.models.hibari.family"
    assert [s.model_stage for s in p.stages] == ["synthesizer"]
    assert p.stage_model_name(p.stages[0]) == "hibari__synthesizer"
    q = get_pipeline("qwen3_tts_tiny_random")
    assert [(s.model_stage, s.kind, s.input_sources) for s in q.stages] == [
        ("talker", "stream", ()), ("code2wav", "batched", (0,))]
    assert q.final_stage.model_stage == "code2wav"
    for p in pipelines().values():   # every import path in a declaration names a module
        import_path(p.adapter)
        for path in [s.transfer for s in p.stages if s.transfer] + [s.triton_class for s in p.stages]:
            assert importlib.util.find_spec(path.rpartition(".")[0]) is not None, path


def test_unknown_pipeline_names_the_known_ones():
    with pytest.raises(KeyError, match="hibari"):
        get_pipeline("nope")


def _stage(i, final=False, sources=(), kind="stream", transfer=None, inputs=()):
    return StageConfig(stage_id=i, model_stage=f"s{i}", kind=kind, triton_class="x.Y",
                       outputs=AUDIO if final else CODES, final_output=final, input_sources=sources,
                       transfer="x.T" if transfer is None and sources else (transfer or ""), inputs=inputs)


@pytest.mark.parametrize("stages,msg", [
    ((_stage(0), _stage(2, final=True, sources=(0,))), "0..N-1"),
    ((_stage(0), _stage(1, sources=(0,))), "exactly one stage"),
    ((_stage(0, sources=(1,)), _stage(1, final=True)), "not earlier stages"),
    ((_stage(0), _stage(1, final=True, sources=(1,))), "not earlier stages"),
    ((_stage(0), _stage(1, final=True, sources=(0,), transfer="")), "no transfer hook"),
    ((_stage(0, transfer="x.T"), _stage(1, final=True, sources=(0,))), "no input_sources"),
    ((_stage(0, kind="batched"), _stage(1, final=True, sources=(0,))), "must be a stream stage"),
    ((_stage(0), _stage(1, sources=(0,)), _stage(2, final=True, sources=(0,))), "goes nowhere"),
    ((_stage(0), _stage(1, final=True, sources=(0,), inputs=(TensorSpec("REQUEST", "STRING", (1,)),))),
     "reserved"),
    ((dataclasses.replace(_stage(0, final=True), outputs=CODES),), "must output AUDIO"),
])
def test_invalid_graphs_are_rejected(stages, msg):
    with pytest.raises(ValueError, match=msg):
        PipelineConfig(name="bad", family="x", adapter="x.A", stages=stages, default_deploy="x").validate()


def test_a_dag_with_fan_out_is_valid():
    stages = (_stage(0), _stage(1, sources=(0,)), _stage(2, final=True, sources=(0, 1)))
    PipelineConfig(name="dag", family="x", adapter="x.A", stages=stages, default_deploy="x").validate()


def test_the_pipeline_behind_openais_model_names_is_declared_by_its_family():
    """The speech API names no family: its default for tts-1 & co. is the declared one, which
    needs no checkpoint from the user."""
    assert openai_default_pipeline() == "hibari"
    assert [n for n, p in pipelines().items() if p.openai_default] == ["hibari"]
    assert get_pipeline("hibari").default_model is not None


def test_a_family_declaring_a_known_pipeline_is_rejected(tmp_path, monkeypatch):
    (tmp_path / "clash_family.py").write_text(
        "from omni_backend.families import get_pipeline\nPIPELINES = (get_pipeline('hibari'),)\n")
    with pytest.raises(ValueError, match="declared by omni_backend.models.hibari.family and clash_family"):
        load_family("clash_family", str(tmp_path))


def test_tensor_dtypes_are_checked():
    with pytest.raises(ValueError, match="dtype"):
        TensorSpec("X", "FLOAT", (1,))


TEXT = TensorSpec("TEXT_DELTA", "STRING", (1,))


def _texting(i, client_outputs=("TEXT_DELTA",), outputs=CODES + (TEXT,), **kw):
    return dataclasses.replace(_stage(i, **kw), outputs=outputs, client_outputs=client_outputs)


def _pipeline(*stages):
    return PipelineConfig(name="p", family="x", adapter="x.A", stages=stages, default_deploy="x")


@pytest.mark.parametrize("stages,msg", [
    ((_texting(0, client_outputs=("TEXT",)), _stage(1, final=True, sources=(0,))),
     r"stage 0 \(s0\) client output 'TEXT' is not one of its outputs \(CODES, TEXT_DELTA\)"),
    ((_texting(0, client_outputs=("AUDIO",), outputs=CODES + AUDIO), _stage(1, final=True, sources=(0,))),
     r"stage 0 \(s0\) client output 'AUDIO' clashes with a reserved name"),
    ((_texting(0, client_outputs=("SAMPLE_RATE",), outputs=CODES + (TensorSpec("SAMPLE_RATE", "INT32", (1,)),)),
      _stage(1, final=True, sources=(0,))), r"client output 'SAMPLE_RATE' clashes with a reserved name"),
    ((_texting(0, client_outputs=("ERROR",), outputs=CODES + (TensorSpec("ERROR", "STRING", (1,)),)),
      _stage(1, final=True, sources=(0,))), r"client output 'ERROR' clashes with a reserved name"),
    ((_texting(0, client_outputs=("TEXT_DELTA", "TEXT_DELTA")), _stage(1, final=True, sources=(0,))),
     r"lists client output 'TEXT_DELTA' twice"),
    ((_texting(0), _texting(1, sources=(0,), outputs=CODES + (TensorSpec("TEXT_DELTA", "INT64", (-1,)),)),
      _stage(2, final=True, sources=(1,))),
     r"client output 'TEXT_DELTA' is STRING \[1\] in stage 0 \(s0\) but INT64 \[-1\] in stage 1 \(s1\)"),
])
def test_bad_client_outputs_are_named(stages, msg):
    with pytest.raises(ValueError, match=msg):
        _pipeline(*stages).validate()


def test_client_outputs_are_one_entry_output_per_name():
    p = _pipeline(_texting(0), _texting(1, sources=(0,)), _stage(2, final=True, sources=(1,)))
    p.validate()   # the same name with the same spec in two stages is one entry output
    assert p.client_output_specs() == (TEXT,)
    assert _pipeline(_stage(0, final=True)).client_output_specs() == ()


def test_a_stage_read_only_by_the_client_goes_somewhere():
    # stage 1 feeds nobody but the client: its text is its output
    _pipeline(_stage(0), _texting(1, sources=(0,)), _stage(2, final=True, sources=(0,))).validate()


def test_skipped_stages_take_their_consumers_and_idle_sources_along():
    # 0 (text to the client) feeds 1 and 2, which both feed 3 (the final stage)
    p = _pipeline(_texting(0), _stage(1, sources=(0,)), _stage(2, sources=(0,)),
                  _stage(3, final=True, sources=(1, 2)))
    p.validate()
    assert p.stages_run() == {0, 1, 2, 3}
    assert p.stages_run(frozenset({1})) == {0}         # 3 reads 1: skipped; 2 then feeds nobody
    assert p.stages_run(frozenset({3})) == {0}         # the final stage alone: text only
    with pytest.raises(ValueError, match=r"skipping stages \[0\] leaves nothing for the client"):
        p.stages_run(frozenset({0}))
    with pytest.raises(ValueError, match=r"skipped stages \[7\] do not exist"):
        p.stages_run(frozenset({7}))
    audio_only = _pipeline(_stage(0), _stage(1, final=True, sources=(0,)))
    with pytest.raises(ValueError, match="leaves nothing for the client"):
        audio_only.stages_run(frozenset({1}))


def test_adapters_skip_no_stage_by_default():
    from omni_backend.adapters.base import TTSAdapter

    assert TTSAdapter().skipped_stages({"text": "hi"}) == frozenset()
    for p in pipelines().values():   # every served pipeline runs all its stages for a plain request
        assert p.stages_run() == frozenset(range(len(p.stages)))
