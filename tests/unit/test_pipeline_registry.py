from __future__ import annotations

import pytest

from omni_backend.pipeline import PipelineConfig, StageConfig, get_pipeline, pipelines, register


def test_builtin_hibari_is_registered():
    p = get_pipeline("hibari")
    assert p.model_type == "hibari"
    assert [s.model_stage for s in p.stages] == ["synthesizer"]
    assert p.final_stage.engine_output_type == "audio"
    assert p.stage_model_name(p.stages[0]) == "hibari__synthesizer"
    assert "hibari" in pipelines()


def test_unknown_pipeline_names_the_known_ones():
    with pytest.raises(KeyError, match="hibari"):
        get_pipeline("nope")


def _stage(i, final=False, sources=()):
    return StageConfig(stage_id=i, model_stage=f"s{i}", execution_type="llm_ar",
                       engine_output_type="audio" if final else "latent", final_output=final,
                       input_sources=sources)


@pytest.mark.parametrize("stages,msg", [
    ((_stage(0), _stage(2, final=True)), "0..N-1"),
    ((_stage(0), _stage(1)), "exactly one stage"),
    ((_stage(0, sources=(1,)), _stage(1, final=True)), "later stages"),
])
def test_invalid_topologies_are_rejected(stages, msg):
    with pytest.raises(ValueError, match=msg):
        register(PipelineConfig(name="bad", model_type="x", stages=stages, default_deploy="x"))


def test_duplicate_registration_is_rejected():
    with pytest.raises(ValueError, match="already registered"):
        register(get_pipeline("hibari"))
