from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ensemble_builder.__main__ import REPO_DIR, check, main

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_is_deterministic(tmp_path):
    assert main(["build", "--all", "--out", str(tmp_path / "a")]) == 0
    assert main(["build", "--all", "--out", str(tmp_path / "b")]) == 0
    a, b = _snapshot(tmp_path / "a"), _snapshot(tmp_path / "b")
    assert a == b and "hibari/config.pbtxt" in a and "hibari__synthesizer/1/model.py" in a


def test_model_py_shims_only_wire(tmp_path):
    main(["build", "--pipeline", "hibari", "--out", str(tmp_path)])
    code = (tmp_path / "hibari" / "1" / "model.py").read_text()
    assert len(code.splitlines()) <= 3 and "as TritonPythonModel" in code


def test_committed_repository_is_fresh():
    assert check(REPO_DIR) == []


def test_check_fails_on_a_stale_repository(tmp_path):
    main(["build", "--all", "--out", str(tmp_path)])
    assert check(tmp_path) == []
    cfg = tmp_path / "hibari" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("count: 1", "count: 2"))
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "config.pbtxt").write_text("")
    diffs = check(tmp_path)
    assert "differs: hibari/config.pbtxt" in diffs
    assert "not built by the builder: stray/config.pbtxt" in diffs
    r = subprocess.run([sys.executable, "-m", "ensemble_builder", "check", "--repo", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "stale" in r.stderr


def test_deploy_override_and_bad_deploy(tmp_path):
    good = tmp_path / "d.yaml"
    good.write_text("pipeline: hibari\nentry:\n  max_streams: 3\nstages:\n  - stage_id: 0\n    instances: 2\n")
    assert main(["build", "--pipeline", "hibari", "--deploy", str(good), "--out", str(tmp_path / "r")]) == 0
    assert '\\"max_streams\\":3' in (tmp_path / "r" / "hibari" / "config.pbtxt").read_text()
    assert "count: 2" in (tmp_path / "r" / "hibari__synthesizer" / "config.pbtxt").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: hibari\nstages:\n  - stage_id: 0\n    instancez: 2\n")
    r = subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--pipeline", "hibari",
                        "--deploy", str(bad), "--out", str(tmp_path / "x")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "stages[0].instancez: unknown key" in r.stderr


def test_model_path_must_be_a_checkpoint(tmp_path, capsys):
    assert main(["build", "--pipeline", "hibari", "--model", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_a_checkpoint_of_another_architecture_is_refused_when_built(tmp_path, capsys):
    """VoxCPM 1.x (config.json `architecture: voxcpm`, or none, as the reference reads it) is
    another model: the build says so instead of the server failing to load its weights."""
    import json

    from omni_backend.models.voxcpm2.random_checkpoint import checkpoint_config

    for arch in ("voxcpm", None):
        config = {k: v for k, v in checkpoint_config("tiny").items() if k != "architecture"}
        folder = tmp_path / f"voxcpm1-{arch}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, **({"architecture": arch} if arch else {})}))
        assert main(["build", "--pipeline", "voxcpm2", "--model", str(folder), "--out", str(tmp_path / "r")]) == 2
        assert "architecture is 'voxcpm'; this pipeline serves VoxCPM2" in capsys.readouterr().err
    assert not (tmp_path / "r" / "voxcpm2").exists()
    # a VAE of another output rate would be labelled 48 kHz
    config = checkpoint_config("tiny")
    config["audio_vae_config"]["out_sample_rate"] = 44100
    folder = tmp_path / "vae44k"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["build", "--pipeline", "voxcpm2", "--model", str(folder), "--out", str(tmp_path / "r")]) == 2
    assert "audio_vae_config.out_sample_rate is 44100; this pipeline serves 48000 Hz" in capsys.readouterr().err


def test_a_qwen3_tts_checkpoint_of_another_codec_is_refused_when_built(tmp_path, capsys):
    """The reference also knows a 25 Hz speech tokenizer; the code2wav here decodes the 12 Hz one."""
    import json
    import shutil

    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint

    folder = tmp_path / "qwen3_tts_25hz"
    shutil.copytree(resolve_checkpoint("builtin:qwen3_tts_tiny_random"), folder)
    config = folder / "speech_tokenizer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "qwen3_tts_tokenizer_25hz"}))
    assert main(["build", "--pipeline", "qwen3_tts", "--model", str(folder), "--out", str(tmp_path / "r")]) == 2
    assert "model_type is 'qwen3_tts_tokenizer_25hz'; this pipeline decodes" in capsys.readouterr().err


def test_a_bad_orpheus_voice_list_fails_the_build_naming_the_option(tmp_path, capsys):
    deploy = tmp_path / "finetune.yaml"
    deploy.write_text('pipeline: orpheus_tiny_random\nstages:\n  - stage_id: 0\n    engine: torch\n'
                      '    options:\n      voices: "pierre, Pierre"\n')
    assert main(["build", "--pipeline", "orpheus_tiny_random", "--deploy", str(deploy),
                 "--out", str(tmp_path / "r")]) == 2
    assert "finetune.yaml: stages[0].options.voices: 'Pierre' is listed twice" in capsys.readouterr().err


def test_unknown_pipeline(capsys):
    assert main(["build", "--pipeline", "nope", "--out", "/tmp/unused"]) == 2
    assert "unknown pipeline" in capsys.readouterr().err


def test_client_outputs_become_entry_outputs(tmp_path):
    assert main(["build", "--family", "tests.toy_family.family", "--pipeline", "toy_three_stage",
                 "--deploy", str(ROOT / "tests/toy_family/toy_three_stage.yaml"), "--out", str(tmp_path)]) == 0
    entry = (tmp_path / "toy_three_stage" / "config.pbtxt").read_text()
    outputs = entry[entry.index("output ["):entry.index("instance_group")]
    assert [line.split('"')[1] for line in outputs.splitlines() if "name:" in line] == \
        ["AUDIO", "SAMPLE_RATE", "TEXT_DELTA"]
    assert 'name: "TEXT_DELTA"\n    data_type: TYPE_STRING\n    dims: [ 1 ]' in outputs
    writer = (tmp_path / "toy_three_stage__writer" / "config.pbtxt").read_text()
    assert 'name: "TEXT_DELTA"' in writer   # the stage declares it as any other output


_CLASHING_FAMILY = '''
from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

def _stage(i, text, **kw):
    return StageConfig(stage_id=i, model_stage=f"s{i}", kind="stream", triton_class="x.Y",
                       outputs=(TensorSpec("CODES", "INT64", (-1,)), text), client_outputs=(text.name,), **kw)

PIPELINES = (PipelineConfig(name="clashing_outputs", family="x", adapter="x.A", default_deploy="x", stages=(
    _stage(0, TensorSpec("TEXT_DELTA", "STRING", (1,))),
    _stage(1, SECOND, input_sources=(0,), transfer="x.T"),
    StageConfig(stage_id=2, model_stage="s2", kind="batched", triton_class="x.Y", final_output=True,
                input_sources=(1,), transfer="x.T", outputs=(TensorSpec("AUDIO", "FP32", (-1,)),)))),)
'''


@pytest.mark.parametrize("second,msg", [
    ('TensorSpec("TEXT_DELTA", "STRING", (-1,))',
     r"client output 'TEXT_DELTA' is STRING \[1\] in stage 0 \(s0\) but STRING \[-1\] in stage 1 \(s1\)"),
    ('TensorSpec("AUDIO", "FP32", (-1,))', r"stage 1 \(s1\) client output 'AUDIO' clashes with a reserved name"),
])
def test_a_clashing_client_output_fails_the_build_naming_it(tmp_path, second, msg):
    (tmp_path / "clashing_family.py").write_text(_CLASHING_FAMILY.replace("SECOND", second))
    r = subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--family", "clashing_family",
                        "--pipeline", "clashing_outputs", "--out", str(tmp_path / "r")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert re.search(r"error: pipeline clashing_outputs: " + msg, r.stderr), r.stderr


def test_qwen3_omni_gpu_deploy_builds(tmp_path):
    """deploy/qwen3_omni.gpu.yaml builds: thinker, talker and code2wav on the GPU, the AR stages in
    throughput mode with their graph buckets, code2wav Float32."""
    from omni_backend.deploy import load_deploy
    from omni_backend.models.qwen3_omni.builtin import resolve_checkpoint

    model = resolve_checkpoint("builtin:qwen3_omni_tiny_random")   # any checkpoint folder of the layout
    assert main(["build", "--pipeline", "qwen3_omni", "--deploy", str(ROOT / "deploy" / "qwen3_omni.gpu.yaml"),
                 "--model", model, "--out", str(tmp_path)]) == 0
    for stage in ("thinker", "talker", "code2wav"):
        config = (tmp_path / f"qwen3_omni__{stage}" / "config.pbtxt").read_text()
        assert "KIND_GPU" in config, stage
    deploy = load_deploy(ROOT / "deploy" / "qwen3_omni.gpu.yaml")
    for stage_id in (0, 1):
        sd = deploy.stage(stage_id)
        assert (sd.device, sd.dtype, sd.options["batch_mode"]) == ("cuda", "bfloat16", "throughput")
        assert sd.cuda_graph_sizes == [1, 2, 4, 8, 16] and not sd.enforce_eager and sd.max_num_seqs == 16
    assert deploy.stage(2).device == "cuda" and deploy.stage(2).dtype == "float32"


def test_a_stage_in_the_entry_process_gets_no_model(tmp_path):
    """`process: entry`: the entry loads the stage itself; the repository has no model for it (a
    stale one from an earlier build is removed), and the entry does not wait for one."""
    from ensemble_builder.build import build

    pipeline = "qwen3_tts_tiny_random"
    build(pipeline, tmp_path)
    assert (tmp_path / f"{pipeline}__talker").is_dir()
    written = build(pipeline, tmp_path, Path(__file__).resolve().parents[2] / "deploy" / f"{pipeline}.in_entry.yaml")
    assert sorted(p.name for p in written) == [pipeline, f"{pipeline}__code2wav"]
    assert not (tmp_path / f"{pipeline}__talker").exists()
    entry = (tmp_path / pipeline / "config.pbtxt").read_text()
    assert re.search(r'key: "stages"\s*value \{\s*string_value: "qwen3_tts_tiny_random__code2wav"', entry), entry
