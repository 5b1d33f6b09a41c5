from __future__ import annotations

from pathlib import Path

import pytest

from omni_backend.deploy import DEPLOY_DIR, DeployError, load_deploy, parse_deploy


@pytest.mark.parametrize("path", sorted(DEPLOY_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_committed_deploy_files_are_valid(path):
    cfg = load_deploy(path)
    assert cfg.pipeline == path.stem or cfg.pipeline


def test_defaults_fill_missing_keys():
    cfg = parse_deploy({"pipeline": "hibari", "stages": [{"stage_id": 0, "max_num_seqs": 4}]})
    assert cfg.stage(0).max_num_seqs == 4
    assert cfg.stage(0).threads == 1
    assert cfg.async_chunk.chunk_frames == 25 and cfg.async_chunk.left_context_frames == 72
    assert cfg.stage(3).stage_id == 3  # stages not listed get defaults


def test_batch_invariant_defaults_to_the_device():
    cfg = parse_deploy({"pipeline": "p", "stages": [{"stage_id": 0}, {"stage_id": 1, "device": "cuda"},
                                                    {"stage_id": 2, "batch_invariant": False},
                                                    {"stage_id": 3, "device": "cuda:1", "batch_invariant": True}]})
    assert [cfg.stage(i).batch_invariant for i in range(4)] == [True, False, False, True]
    assert cfg.stage(9).batch_invariant   # an unlisted stage: CPU default
    assert parse_deploy(cfg.to_dict()).to_dict() == cfg.to_dict()   # what the builder writes reads back


@pytest.mark.parametrize("raw,key", [
    ({}, "pipeline"),
    ({"pipeline": "p", "colour": 1}, "colour"),
    ({"pipeline": "p", "entry": {"instances": 0}}, "entry.instances"),
    ({"pipeline": "p", "entry": {"max_stream": 3}}, "entry.max_stream"),
    ({"pipeline": "p", "entry": {"bls_threads": 81}}, "entry.bls_threads"),   # the backend's pool, less 16
    ({"pipeline": "p", "async_chunk": {"chunk_frames": 0}}, "async_chunk.chunk_frames"),
    ({"pipeline": "p", "async_chunk": {"enabled": "yes"}}, "async_chunk.enabled"),
    ({"pipeline": "p", "async_chunk": {"continuity_rtf": 2}}, "async_chunk.continuity_rtf"),
    ({"pipeline": "p", "async_chunk": {"left_context": 5}}, "async_chunk.left_context"),
    ({"pipeline": "p", "stages": {"stage_id": 0}}, "stages"),
    ({"pipeline": "p", "stages": [{"stage_id": 0}, {"stage_id": 0}]}, "stages"),
    ({"pipeline": "p", "stages": [{"max_num_seqs": 0}]}, "stages[0].max_num_seqs"),
    ({"pipeline": "p", "stages": [{"max_num_seqs": 2.5}]}, "stages[0].max_num_seqs"),
    ({"pipeline": "p", "stages": [{"engine": "tensorrt"}]}, "stages[0].engine"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "max_prefills_per_step": 2}]}, "stages[0].max_prefills_per_step"),
    ({"pipeline": "p", "stages": [{"batch_invariant": True, "engine": "vllm"}]}, "stages[0].batch_invariant"),
    ({"pipeline": "p", "stages": [{"block_size": 32}]}, "stages[0].block_size"),
    ({"pipeline": "p", "stages": [{"gpu_memory_utilization": 0.5, "device": "cuda"}]},
     "stages[0].gpu_memory_utilization"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "block_size": 48}]}, "stages[0].block_size"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "block_size": 0}]}, "stages[0].block_size"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "device": "cuda", "block_size": 24}]}, "stages[0].block_size"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "device": "cuda", "gpu_memory_utilization": 0}]},
     "stages[0].gpu_memory_utilization"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "device": "cuda", "gpu_memory_utilization": 1.5}]},
     "stages[0].gpu_memory_utilization"),
    ({"pipeline": "p", "stages": [{"engine": "vllm", "gpu_memory_utilization": 0.5}]},
     "stages[0].gpu_memory_utilization"),
    ({"pipeline": "p", "stages": [{"device": "gpu"}]}, "stages[0].device"),
    ({"pipeline": "p", "stages": [{"dtype": "int4"}]}, "stages[0].dtype"),
    ({"pipeline": "p", "stages": [{"threads": True}]}, "stages[0].threads"),
    ({"pipeline": "p", "stages": [{"cuda_graph_sizes": []}]}, "stages[0].cuda_graph_sizes"),
    ({"pipeline": "p", "stages": [{"cuda_graph_sizes": [1, 0]}]}, "stages[0].cuda_graph_sizes[1]"),
    ({"pipeline": "p", "stages": [{"enforce_eager": 1}]}, "stages[0].enforce_eager"),
    ({"pipeline": "p", "stages": [{"batch_invariant": "no"}]}, "stages[0].batch_invariant"),
    ({"pipeline": "p", "stages": [{"max_prefills_per_step": 0}]}, "stages[0].max_prefills_per_step"),
    ({"pipeline": "p", "stages": [{"default_sampling_params": {"temp": 1}}]},
     "stages[0].default_sampling_params.temp"),
    ({"pipeline": "p", "stages": [{"default_sampling_params": {"top_p": -1}}]},
     "stages[0].default_sampling_params.top_p"),
    ({"pipeline": "p", "stages": [{"stage_idx": 0}]}, "stages[0].stage_idx"),
])
def test_each_bad_key_gets_its_named_error(raw, key):
    with pytest.raises(DeployError) as e:
        parse_deploy(raw, "deploy/x.yaml")
    assert str(e.value).startswith(f"deploy/x.yaml: {key}:"), str(e.value)


def test_vllm_stage_keys_and_defaults():
    cfg = parse_deploy({"pipeline": "p", "stages": [
        {"stage_id": 0, "engine": "vllm"},
        {"stage_id": 1, "engine": "vllm", "device": "cuda", "block_size": 16, "gpu_memory_utilization": 0.5},
        {"stage_id": 2, "engine": "vllm", "device": "cuda"},
        {"stage_id": 3}]})
    assert (cfg.stage(0).block_size, cfg.stage(0).gpu_memory_utilization) == (128, None)   # vLLM's CPU default
    assert (cfg.stage(1).block_size, cfg.stage(1).gpu_memory_utilization) == (16, 0.5)
    assert (cfg.stage(2).block_size, cfg.stage(2).gpu_memory_utilization) == (16, 0.9)
    assert cfg.stage(3).block_size is None and cfg.stage(3).batch_invariant
    # what the builder writes names only the keys each stage's engine reads, and reads back
    stages = cfg.to_dict()["stages"]
    assert "max_prefills_per_step" not in stages[0] and "batch_invariant" not in stages[0]
    assert "gpu_memory_utilization" not in stages[0] and stages[1]["gpu_memory_utilization"] == 0.5
    assert "block_size" not in stages[3] and stages[3]["batch_invariant"] is True
    assert parse_deploy(cfg.to_dict()).to_dict() == cfg.to_dict()


def _pipeline_with_engines(engines: tuple[str, ...]):
    from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

    return PipelineConfig(name="lm", family="toy", adapter="x.Adapter", default_deploy="lm", stages=(
        StageConfig(0, "lm", "stream", "x.Stage", (TensorSpec("AUDIO", "FP32", (-1,)),), final_output=True,
                    engines=engines),))


def test_engine_must_be_one_the_stage_lists():
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    cfg = parse_deploy({"pipeline": "qwen3_tts", "stages": [{"stage_id": 0, "engine": "vllm"}]}, "deploy/x.yaml")
    with pytest.raises(DeployError) as e:
        check_options(cfg, get_pipeline("qwen3_tts"))   # a multi-codebook talker: torch only
    assert str(e.value).startswith("deploy/x.yaml: stages[0].engine: talker runs on engine torch only"), str(e.value)

    vllm_cfg = parse_deploy({"pipeline": "lm", "stages": [{"stage_id": 0, "engine": "vllm"}]}, "deploy/x.yaml")
    assert check_options(vllm_cfg, _pipeline_with_engines(("torch", "vllm"))).stage(0).engine == "vllm"
    with pytest.raises(DeployError, match=r"^deploy/x.yaml: stages\[0\].engine: lm runs on engine vllm only"):
        check_options(parse_deploy({"pipeline": "lm", "stages": [{"stage_id": 0}]}, "deploy/x.yaml"),
                      _pipeline_with_engines(("vllm",)))


def test_yaml_errors_name_the_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: [unclosed\n")
    with pytest.raises(DeployError, match=str(bad)):
        load_deploy(bad)
    with pytest.raises(DeployError, match="file not found"):
        load_deploy(tmp_path / "missing.yaml")


@pytest.mark.parametrize("stages, key", [
    ([{"stage_id": 0, "options": {"subtalker_temprature": 0.5}}], "stages[0].options.subtalker_temprature"),
    ([{"stage_id": 0, "options": {"subtalker_top_k": -1}}], "stages[0].options.subtalker_top_k"),
    ([{"stage_id": 0, "options": {"subtalker_do_sample": "yes"}}], "stages[0].options.subtalker_do_sample"),
    ([{"stage_id": 1, "options": {"subtalker_top_k": 5}}], "stages[0].options.subtalker_top_k"),  # code2wav has none
    ([{"stage_id": 5}], "stages[0].stage_id"),
])
def test_family_options_are_checked_against_the_stage(stages, key):
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    cfg = parse_deploy({"pipeline": "qwen3_tts", "stages": stages}, "deploy/x.yaml")
    with pytest.raises(DeployError) as e:
        check_options(cfg, get_pipeline("qwen3_tts"))
    assert str(e.value).startswith(f"deploy/x.yaml: {key}:"), str(e.value)


def test_family_options_take_their_defaults():
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    cfg = check_options(parse_deploy({"pipeline": "qwen3_tts", "stages": [
        {"stage_id": 0, "options": {"subtalker_top_k": 7}}]}), get_pipeline("qwen3_tts"))
    assert cfg.stage(0).options == {"subtalker_do_sample": None, "subtalker_temperature": None,
                                    "subtalker_top_k": 7, "subtalker_top_p": None, "text_wait_s": 30.0,
                                    "code2wav": "own_stage", "compile": "none"}


@pytest.mark.parametrize("stages, key", [
    ([{"stage_id": 0, "options": {"code2wav": "elsewhere"}}], "stages[0].options.code2wav"),
    ([{"stage_id": 0, "options": {"code2wav": True}}], "stages[0].options.code2wav"),
    ([{"stage_id": 1, "options": {"code2wav": "in_talker"}}], "stages[0].options.code2wav"),  # the talker's choice
])
def test_code2wav_placement_is_checked(stages, key):
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    cfg = parse_deploy({"pipeline": "qwen3_tts_tiny_random", "stages": stages}, "deploy/x.yaml")
    with pytest.raises(DeployError) as e:
        check_options(cfg, get_pipeline("qwen3_tts_tiny_random"))
    assert str(e.value).startswith(f"deploy/x.yaml: {key}:"), str(e.value)


def test_code2wav_placement_of_the_committed_deploys():
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    pipeline = get_pipeline("qwen3_tts_tiny_random")
    for name, placement in (("qwen3_tts_tiny_random.yaml", "own_stage"),
                            ("qwen3_tts_tiny_random.in_talker.yaml", "in_talker"),
                            ("qwen3_tts_tiny_random.in_entry.yaml", "in_talker"),
                            ("qwen3_tts_tiny_random.adaptive.yaml", "adaptive")):
        assert check_options(load_deploy(DEPLOY_DIR / name), pipeline).stage(0).options["code2wav"] == placement


@pytest.mark.parametrize("pipeline, stages, key", [
    # a batch mode is Qwen3-Omni's thinker's and talker's choice only: other families refuse it
    ("qwen3_tts", [{"stage_id": 0, "options": {"batch_mode": "throughput"}}], "stages[0].options.batch_mode"),
    ("orpheus_tiny_random", [{"stage_id": 0, "options": {"batch_mode": "exact"}}], "stages[0].options.batch_mode"),
    ("qwen3_omni", [{"stage_id": 2, "options": {"batch_mode": "throughput"}}], "stages[0].options.batch_mode"),
    ("qwen3_omni", [{"stage_id": 0, "options": {"batch_mode": "fast"}}], "stages[0].options.batch_mode"),
    ("qwen3_omni", [{"stage_id": 1, "options": {"batch_mode": 2}}], "stages[0].options.batch_mode"),
])
def test_batch_mode_is_refused_where_it_does_not_apply(pipeline, stages, key):
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    cfg = parse_deploy({"pipeline": pipeline, "stages": stages}, "deploy/x.yaml")
    with pytest.raises(DeployError) as e:
        check_options(cfg, get_pipeline(pipeline))
    assert str(e.value).startswith(f"deploy/x.yaml: {key}:"), str(e.value)


def test_qwen3_omni_batch_mode_defaults_to_exact():
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    pipeline = get_pipeline("qwen3_omni")
    cfg = check_options(parse_deploy({"pipeline": "qwen3_omni", "stages": [
        {"stage_id": 0}, {"stage_id": 1, "options": {"batch_mode": "THROUGHPUT"}}]}), pipeline)
    assert cfg.stage(0).options["batch_mode"] == "exact"
    assert cfg.stage(1).options["batch_mode"] == "throughput"
    for name, mode in (("qwen3_omni.yaml", "exact"), ("qwen3_omni_tiny_random.yaml", "exact"),
                       ("qwen3_omni_tiny_random.throughput.yaml", "throughput")):
        cfg = check_options(load_deploy(DEPLOY_DIR / name), get_pipeline(load_deploy(DEPLOY_DIR / name).pipeline))
        assert [cfg.stage(i).options["batch_mode"] for i in (0, 1)] == [mode, mode], name


@pytest.mark.parametrize("pipeline, raw, key, says", [
    ("qwen3_tts_tiny_random", {"stages": [{"stage_id": 0, "process": "thread"}]}, "stages[0].process", "own, entry"),
    ("qwen3_tts_tiny_random", {"stages": [{"stage_id": 1, "process": "entry"}]}, "stages[0].process",
     "code2wav is a batched one"),   # called per window, batched across streams
    ("qwen3_tts_tiny_random", {"stages": [{"stage_id": 0, "process": "entry", "instances": 2}]},
     "stages[0].process", "instances: 1"),
    ("qwen3_tts_tiny_random", {"entry": {"instances": 2}, "stages": [{"stage_id": 0, "process": "entry"}]},
     "stages[0].process", "entry.instances: 1"),
    ("orpheus_tiny_random", {"stages": [{"stage_id": 0, "process": "entry", "engine": "vllm"}]},
     "stages[0].process", "engine: torch"),
])
def test_a_stage_in_the_entry_process_is_checked(pipeline, raw, key, says):
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    with pytest.raises(DeployError) as e:
        check_options(parse_deploy({"pipeline": pipeline, **raw}, "deploy/x.yaml"), get_pipeline(pipeline))
    assert str(e.value).startswith(f"deploy/x.yaml: {key}:") and says in str(e.value), str(e.value)


def test_a_stage_fed_by_another_stage_may_run_in_the_entry():
    """Qwen3-Omni's talker (fed by the thinker through the entry) in the entry's process."""
    from omni_backend.deploy import check_options
    from omni_backend.families import get_pipeline

    raw = {"pipeline": "qwen3_omni_tiny_random", "stages": [{"stage_id": 1, "process": "entry"}]}
    cfg = check_options(parse_deploy(raw, "deploy/x.yaml"), get_pipeline("qwen3_omni_tiny_random"))
    assert cfg.stage(1).process == "entry" and cfg.stage(0).process == "own"


def test_process_defaults_to_own_and_reads_back():
    cfg = parse_deploy({"pipeline": "p", "stages": [{"stage_id": 0, "process": "entry"}, {"stage_id": 1}]})
    assert [cfg.stage(i).process for i in (0, 1, 2)] == ["entry", "own", "own"]
    assert parse_deploy(cfg.to_dict()).to_dict() == cfg.to_dict()
