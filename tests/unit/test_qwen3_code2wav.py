"""Qwen3-TTS 12 Hz codec decoder (code2wav): parity with the reference qwen-tts, the stateless
window contract, batching of windows, and the random speech-tokenizer checkpoint writer.

Oracle tests run the reference in .venv-oracle once per module, by subprocess
(tests/oracle/qwen3_code2wav_reference.py); without that venv they skip, or fail under CI
(``require_qwen3_oracle``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_backend.models.qwen3_tts.code2wav import (
    Code2Wav,
    Code2WavConfig,
    CodecChunkSchedule,
    CodecWindow,
    plan_stream_windows,
)
from omni_backend.models.qwen3_tts.random_speech_tokenizer import (
    speech_tokenizer_config,
    speech_tokenizer_tensor_specs,
    write_speech_tokenizer,
)

from tests.qwen3_fixtures import QWEN3_ORACLE_PYTHON, REPO, require_qwen3_oracle

ORACLE_SCRIPT = REPO / "tests" / "oracle" / "qwen3_code2wav_reference.py"
HOP = 1920
FRAMES = 60
SEED = 7
# (initial chunk, chunk, left context) schedules streamed in the tests
SCHEDULES = {"chunk25_ctx72": (2, 25, 72), "chunk5_ctx10": (2, 5, 10)}
# the reference's chunked decode, exercised with a small chunk so that T=60 takes several chunks
CHUNKED = (20, 7)

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread():
    """The tiny decoder is overhead-bound; one thread avoids OpenMP oversubscription (seen to slow a
    97-frame window from 50 ms to 2.6 s) when other processes share the CPU cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_speech_tokenizer") / "tiny"
    write_speech_tokenizer(str(path), "tiny", SEED)
    return path


@pytest.fixture(scope="module")
def code2wav(tiny_dir) -> Code2Wav:
    return Code2Wav.from_checkpoint(tiny_dir)


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    rng = np.random.default_rng(11)
    return torch.from_numpy(rng.integers(0, 2048, size=(2, 16, FRAMES), dtype=np.int64))


@pytest.fixture(scope="module")
def reference(tiny_dir, codes, tmp_path_factory) -> dict:
    """Everything the reference computes for these tests, from one subprocess."""
    require_qwen3_oracle()
    work = tmp_path_factory.mktemp("qwen3_code2wav_oracle")
    np.save(work / "codes.npy", codes.numpy())
    configs = []
    for size in ("tiny", "small", "0.6b"):
        path = work / f"config_{size}.json"
        path.write_text(json.dumps(speech_tokenizer_config(size)))
        configs.append(str(path))
    windows = {name: plan_stream_windows(FRAMES, *schedule) for name, schedule in SCHEDULES.items()}
    flat = [[w.start_frame, w.left_context_frames, w.end_frame] for ws in windows.values() for w in ws]
    request = {"checkpoint": str(tiny_dir), "codes": str(work / "codes.npy"), "chunked": [list(CHUNKED)],
               "windows": flat, "encode_seconds": 1.0, "key_shapes_for": configs}
    (work / "request.json").write_text(json.dumps(request))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([str(QWEN3_ORACLE_PYTHON), str(ORACLE_SCRIPT), str(work / "request.json"),
                          str(work / "result.npz")], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, f"reference failed:\n{run.stderr[-4000:]}"
    result = np.load(work / "result.npz")
    out = {key: result[key] for key in result.files if key != "info"}
    out["info"] = json.loads(str(result["info"]))
    out["config_paths"] = dict(zip(("tiny", "small", "0.6b"), configs))
    # per-schedule list of the reference's window audio, in stream order
    index = 0
    out["windows"] = {}
    for name, ws in windows.items():
        out["windows"][name] = [out[f"window_{index + i}"] for i in range(len(ws))]
        index += len(ws)
    return out


# ----------------------------------------------------------------------------- window planning


def test_plan_covers_stream_with_fixed_size_windows():
    windows = plan_stream_windows(160, initial_chunk_frames=2, chunk_frames=25, left_context_frames=72)
    assert windows[0] == CodecWindow(0, 0, 2)
    assert [w.new_frames for w in windows] == [2, 25, 25, 25, 25, 25, 25, 8]
    position = 0
    for window in windows:
        assert window.first_new_frame == position  # contiguous, no gap, no overlap of new audio
        assert window.left_context_frames == min(72, position)
        position = window.end_frame
    assert position == 160
    assert {w.total_frames for w in windows[4:-1]} == {97}  # steady state: 72 + 25


@pytest.mark.parametrize("schedule", [(2, 25, 72), (2, 25, 0), (5, 10, 3), (1, 1, 4), (30, 7, 12)])
def test_full_window_shapes_are_every_full_window_a_stream_makes(schedule):
    shapes = CodecChunkSchedule(*schedule).full_window_shapes()
    windows = plan_stream_windows(400, *schedule)[:-1]   # the last window may be partial
    assert {(w.total_frames, w.left_context_frames) for w in windows} == set(shapes)
    assert len(shapes) == len(set(shapes))
    assert CodecChunkSchedule(2, 25, 72).full_window_shapes() == [(2, 0), (27, 2), (52, 27), (77, 52), (97, 72)]


@pytest.mark.parametrize("total", [0, 1, 2, 3, 27, 28, 101])
def test_plan_flushes_last_partial_chunk(total):
    windows = plan_stream_windows(total, 2, 25, 72)
    assert sum(w.new_frames for w in windows) == total
    assert all(w.new_frames > 0 for w in windows)


def test_schedule_waits_for_full_chunk_until_finished():
    schedule = CodecChunkSchedule(initial_chunk_frames=4, chunk_frames=5, left_context_frames=3)
    assert schedule.next_window(0, 3, finished=False) is None
    assert schedule.next_window(0, 9, finished=False) == CodecWindow(0, 0, 4)
    assert schedule.next_window(4, 8, finished=False) is None
    assert schedule.next_window(4, 9, finished=False) == CodecWindow(1, 3, 9)
    assert schedule.next_window(9, 11, finished=True) == CodecWindow(6, 3, 11)
    assert schedule.next_window(11, 11, finished=True) is None
    with pytest.raises(ValueError):
        CodecChunkSchedule(chunk_frames=0)


# ----------------------------------------------------------------------------- checkpoint writer


def test_writer_is_deterministic_and_loads(tmp_path, tiny_dir, code2wav):
    again = tmp_path / "again"
    write_speech_tokenizer(str(again), "tiny", SEED)
    assert (again / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert (again / "config.json").read_text() == (tiny_dir / "config.json").read_text()
    other = tmp_path / "other"
    write_speech_tokenizer(str(other), "tiny", SEED + 1)
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz" and "encoder_config" in config
    assert json.loads((tiny_dir / "preprocessor_config.json").read_text())["sampling_rate"] == 24000
    assert (code2wav.sample_rate, code2wav.hop_length, code2wav.num_quantizers) == (24000, HOP, 16)
    with pytest.raises(ValueError, match="unknown speech tokenizer size"):
        write_speech_tokenizer(str(tmp_path / "bad"), "huge", 0)


@pytest.mark.parametrize("size", ["tiny", "small", "0.6b", "1.7b"])
def test_decoder_tensor_specs_are_code2wav_parameters(size):
    config = speech_tokenizer_config(size)
    with torch.device("meta"):
        model = Code2Wav(Code2WavConfig.from_speech_tokenizer_config(config))
    ours = {f"decoder.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    specs = {s.name: s.shape for s in speech_tokenizer_tensor_specs(config) if s.name.startswith("decoder.")}
    assert specs == ours


def test_random_codec_depends_on_codes_and_stays_out_of_clipping(code2wav, codes):
    audio = code2wav.decode(codes)
    assert audio.shape == (2, FRAMES * HOP) and audio.dtype == torch.float32
    assert 0.05 < float(audio.std()) < 0.5
    assert float((audio.abs() >= 1.0).float().mean()) < 0.01
    changed = codes.clone()
    changed[:, 15, 30] = (changed[:, 15, 30] + 1) % 2048  # one code of the last codebook
    diff = code2wav.decode(changed) - audio
    assert float(diff[:, : 30 * HOP].abs().max()) == 0.0  # causal: the past is untouched
    assert float(diff[:, 30 * HOP:].pow(2).mean().sqrt()) > 0.05 * float(audio.std())


def test_decode_rejects_bad_codes(code2wav, codes):
    with pytest.raises(ValueError):
        code2wav.decode(codes[:, :15])
    bad = codes.clone()
    bad[0, 0, 0] = 2048
    with pytest.raises(ValueError):
        code2wav.decode(bad)
    with pytest.raises(ValueError):
        code2wav.decode(codes.float())


# ----------------------------------------------------------------------------- parity with the reference


@pytest.mark.oracle
def test_reference_loads_written_checkpoint_with_every_key(reference):
    loading = reference["info"]["loading"]
    assert loading == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    for size, path in reference["config_paths"].items():
        config = json.loads(Path(path).read_text())
        ours = {s.name: list(s.shape) for s in speech_tokenizer_tensor_specs(config)}
        assert reference["info"]["key_shapes"][path] == ours, size
    encoded = reference["encoded"]  # the random Mimi encoder, through the reference's wrapper
    assert encoded.shape == (13, 16)
    assert min(len(set(encoded[:, k].tolist())) for k in range(16)) > 1


@pytest.mark.oracle
def test_full_decode_matches_reference(code2wav, codes, reference):
    # default (batch-invariant) mode: each item as the reference decodes it alone
    ours = code2wav.decode(codes).numpy()
    assert ours.shape == reference["full"].shape == (2, FRAMES * HOP)
    assert np.abs(ours - reference["full"]).max() <= 1e-5
    chunked = code2wav.decode(codes, *CHUNKED).numpy()
    assert np.abs(chunked - reference["chunked_0"]).max() <= 1e-5
    # one-pass batched mode: the whole batch as the reference decodes the batch
    code2wav.batch_invariant = False
    try:
        batched = code2wav.decode(codes).numpy()
    finally:
        code2wav.batch_invariant = True
    assert np.abs(batched - reference["full_batched"]).max() <= 1e-5


@pytest.mark.oracle
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_streamed_windows_match_reference(code2wav, codes, reference, name):
    schedule = CodecChunkSchedule(*SCHEDULES[name])
    pieces = list(code2wav.decode_stream(codes, schedule))
    for ours, theirs in zip(pieces, reference["windows"][name], strict=True):
        assert ours.shape == theirs.shape
        assert np.abs(ours.numpy() - theirs).max() <= 1e-4
    streamed = torch.cat(pieces, dim=-1).numpy()
    assert streamed.shape == (2, FRAMES * HOP)
    if schedule.left_context_frames >= FRAMES:
        # every window sees the whole prefix: the stream equals the reference's full decode
        assert np.abs(streamed - reference["full"]).max() <= 1e-4
    else:
        # 10 frames of context cut what the sliding-window (72) layers see: the windows equal the
        # reference's windows (above), not its full decode
        assert np.abs(streamed - reference["full"]).max() > 1e-3


def test_vocoder_runs_only_on_the_context_it_needs(code2wav):
    """decode_window runs the convolutional vocoder from ``left - vocoder_context_frames`` only;
    that bound (10 frames: 9.38 by the layers' kernels) keeps the kept audio unchanged."""
    with torch.device("meta"):
        real = Code2Wav(Code2WavConfig.from_speech_tokenizer_config(speech_tokenizer_config("0.6b")))
    assert real.vocoder_context_frames == code2wav.vocoder_context_frames == 10
    window = torch.randint(0, 2048, (1, 16, 97), generator=torch.Generator().manual_seed(9))
    cropped = code2wav.decode_window(window, 72)
    saved = code2wav.vocoder_context_frames
    try:
        code2wav.vocoder_context_frames = 10 ** 6  # vocoder over the whole window
        whole = code2wav.decode_window(window, 72)
        code2wav.vocoder_context_frames = 7  # too little context: the first new frame changes
        short = code2wav.decode_window(window, 72)
    finally:
        code2wav.vocoder_context_frames = saved
    assert cropped.shape == whole.shape == (1, 25 * HOP)
    assert float((cropped - whole).abs().max()) <= 1e-5
    assert float((short - whole)[:, :HOP].abs().max()) > 1e-3


# ----------------------------------------------------------------------------- batching of windows


def _mixed_windows(code2wav):
    generator = torch.Generator().manual_seed(5)
    shapes = [(97, 72), (2, 0), (27, 2), (97, 72), (35, 10), (52, 27)]
    windows = [torch.randint(0, code2wav.config.codebook_size, (16, n), generator=generator) for n, _ in shapes]
    return windows, [left for _, left in shapes]


def test_batch_of_windows_equals_each_alone(code2wav):
    windows, lefts = _mixed_windows(code2wav)
    alone = [code2wav.decode_window(w[None], left)[0] for w, left in zip(windows, lefts)]
    assert code2wav.batch_invariant  # the CPU default
    batched = code2wav.decode_windows(windows, lefts)
    for one, many, w, left in zip(alone, batched, windows, lefts):
        assert many.shape == ((w.shape[-1] - left) * HOP,)
        assert torch.equal(one, many)
    same_length = torch.stack([windows[0], windows[3]])
    stacked = code2wav.decode_window(same_length, 72)
    assert torch.equal(stacked[0], alone[0]) and torch.equal(stacked[1], alone[3])


def test_one_pass_padded_batch_equals_each_alone_up_to_rounding(code2wav):
    windows, lefts = _mixed_windows(code2wav)
    alone = [code2wav.decode_window(w[None], left)[0] for w, left in zip(windows, lefts)]
    code2wav.batch_invariant = False
    try:
        batched = code2wav.decode_windows(windows, lefts)
    finally:
        code2wav.batch_invariant = True
    # kernels of other shapes round differently, and the random tiny vocoder amplifies that
    # (its hidden activations reach ~15): a few 1e-6 measured
    worst = max(float((one - many).abs().max()) for one, many in zip(alone, batched))
    assert worst <= 5e-5, worst


# ----------------------------------------------------------------------------- speed note


def test_window_decode_speed_note(code2wav, record_property):
    """A 25-frame window with 72 frames of context (97 frames, ~7.8 s of audio decoded to keep
    1 s), tiny decoder, batch 1 and 8, one CPU thread. Recorded, loosely bounded."""
    generator = torch.Generator().manual_seed(3)
    timings = {}
    for batch in (1, 8):
        window = torch.randint(0, 2048, (batch, 16, 97), generator=generator)
        code2wav.decode_window(window, 72)  # warm-up
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            audio = code2wav.decode_window(window, 72)
            best = min(best, time.perf_counter() - start)
        assert audio.shape == (batch, 25 * HOP)
        timings[batch] = best
        record_property(f"tiny_window97_batch{batch}_ms", round(best * 1000, 1))
    print(f"\n[code2wav tiny] 25+72-frame window: batch 1 {timings[1] * 1000:.0f} ms, "
          f"batch 8 {timings[8] * 1000:.0f} ms", file=sys.stderr)
    assert timings[1] < 10.0
