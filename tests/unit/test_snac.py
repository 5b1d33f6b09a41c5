"""The SNAC 24 kHz decoder (Orpheus' codec) against the reference package ``snac==1.2.1``.

Random checkpoints in the released layout (``omni_backend.models.orpheus.random_snac``) are decoded by
our :class:`SNACDecoder` and by the package itself, run by ``tests/oracle/snac_reference.py`` in
the oracle venv with its NoiseBlock noise drawn from the same per-row seeded generators. The
package's ``SNAC.from_pretrained`` loads strictly, so the oracle run also proves that the
writer's tensor names and shapes are the package's.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_backend.models.orpheus.snac import SNACConfig, load_snac, window_noise_seed
from omni_backend.models.orpheus.random_snac import SNAC_SIZES, main as snac_random_main, write_random_snac
from tests.requirement import require

REPO = Path(__file__).resolve().parents[2]
ORACLE_PYTHON = REPO / ".venv-oracle" / "bin" / "python"
ORACLE_STAMP = REPO / ".venv-oracle" / ".installed-v2"  # the install that added snac==1.2.1
ORACLE_SCRIPT = REPO / "tests" / "oracle" / "snac_reference.py"
PARITY_TOLERANCE = 1e-4
# Batched CPU convolutions (oneDNN) may sum in another order than a single row's; measured
# batch-vs-solo differences are 1e-6 .. 4e-6 (1 .. 2 threads).
BATCH_TOLERANCE = 2e-5

RELEASED_CONFIG = """{"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
"decoder_rates": [8, 8, 4, 2], "attn_window_size": null, "codebook_size": 4096, "codebook_dim": 8,
"vq_strides": [4, 2, 1], "noise": true, "depthwise": true}"""  # hubertsiuzdak/snac_24khz/config.json

# checkpoint name -> writer arguments: the released structure at two widths, and the
# non-depthwise, noise-free variant of the architecture
CHECKPOINTS = {
    "tiny": dict(SNAC_SIZES["tiny"], seed=0),
    "small": dict(SNAC_SIZES["small"], seed=3),
    "plain": dict(SNAC_SIZES["tiny"], seed=5, depthwise=False, noise=False),
}


def require_snac_oracle() -> None:
    """Skip without the oracle venv (or with one installed before snac was added); fail
    instead under ``CI=true``, where a skipped parity test would pass unnoticed."""
    require(ORACLE_PYTHON.exists() and ORACLE_STAMP.exists(),
            f"SNAC reference venv missing or stale: {ORACLE_STAMP} (run `make oracle` or tests/oracle/install.sh)")


def _codes(rng: np.random.Generator, batch: int, frames: int) -> list[np.ndarray]:
    """Codes of ``frames`` coarse frames at the released strides [4, 2, 1]: 1, 2, 4 per frame."""
    return [rng.integers(0, 4096, (batch, frames * 2 ** level), dtype=np.int64) for level in range(3)]


def _parity_cases() -> dict[str, dict]:
    rng = np.random.default_rng(1234)
    edge = [np.array([[0] * n, [4095] * n], dtype=np.int64) for n in (2, 4, 8)]
    return {
        "window4": {"codes": _codes(rng, 1, 4), "seeds": [window_noise_seed(7, 0)]},  # [1,4] [1,8] [1,16]
        "window4_other": {"codes": _codes(rng, 1, 4), "seeds": [window_noise_seed(7, 1)]},
        "frame1": {"codes": _codes(rng, 1, 1), "seeds": [3]},
        "batch3_frames7": {"codes": _codes(rng, 3, 7), "seeds": [0, 2**63 - 1, 12345]},
        "edge_codes": {"codes": edge, "seeds": [1, 1]},
    }


def _as_tensors(codes: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(level) for level in codes]


@pytest.fixture(scope="module")
def snac_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("snac")
    return {name: write_random_snac(root / name, **kwargs) for name, kwargs in CHECKPOINTS.items()}


@pytest.fixture(scope="module")
def snac_reference(snac_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The package's decodes of every parity case, per checkpoint (one oracle process)."""
    require_snac_oracle()
    work = tmp_path_factory.mktemp("snac_oracle")
    cases = _parity_cases()
    arrays = {f"{name}/codes_{i}": level for name, case in cases.items() for i, level in enumerate(case["codes"])}
    arrays.update({f"{name}/seeds": np.array(case["seeds"], dtype=np.int64) for name, case in cases.items()})
    np.savez(work / "cases.npz", **arrays)
    jobs: list[str] = []
    for name, folder in snac_dirs.items():
        jobs += [str(folder), str(work / "cases.npz"), str(work / f"{name}.npz")]
    result = subprocess.run([str(ORACLE_PYTHON), str(ORACLE_SCRIPT), *jobs], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"oracle failed:\n{result.stderr[-4000:]}"
    out = {}
    for name in snac_dirs:
        with np.load(work / f"{name}.npz") as data:
            out[name] = {case: data[case] for case in data.files}
    return out


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("checkpoint", sorted(CHECKPOINTS))
def test_decode_matches_reference(checkpoint: str, snac_dirs, snac_reference) -> None:
    decoder = load_snac(snac_dirs[checkpoint])
    for name, case in _parity_cases().items():
        ours = decoder.decode(_as_tensors(case["codes"]), case["seeds"]).numpy()
        reference = snac_reference[checkpoint][name]
        assert ours.shape == reference.shape == (len(case["seeds"]), 1, case["codes"][0].shape[1] * 2048)
        assert np.isfinite(ours).all() and np.abs(ours).max() < 1.0  # the random codec is not saturated
        diff = float(np.abs(ours - reference).max())
        assert diff <= PARITY_TOLERANCE, f"{checkpoint}/{name}: max abs diff {diff:.3g}"


# --------------------------------------------------------------------------- loading


def test_released_geometry(snac_dirs) -> None:
    decoder = load_snac(snac_dirs["tiny"])
    assert (decoder.hop_length, decoder.vq_strides, decoder.sampling_rate, decoder.frame_samples) == \
        (512, (4, 2, 1), 24000, 2048)
    assert all(not p.requires_grad and p.dtype == torch.float32 for p in decoder.parameters())


def test_both_weight_norm_key_forms_load_the_same(snac_dirs, tmp_path: Path) -> None:
    legacy = write_random_snac(tmp_path / "legacy", **CHECKPOINTS["tiny"], legacy_weight_norm=True)
    keys = torch.load(legacy / "pytorch_model.bin", weights_only=True).keys()
    assert any(k.endswith(".weight_g") for k in keys) and not any(".parametrizations." in k for k in keys)
    ours, theirs = load_snac(snac_dirs["tiny"]).state_dict(), load_snac(legacy).state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_weight_norm_fold_is_g_times_v_over_norm(snac_dirs) -> None:
    """Norm over every dim but 0, also for the transposed convs (dim 0 is their input channel)."""
    raw = torch.load(snac_dirs["tiny"] / "pytorch_model.bin", weights_only=True)
    state = load_snac(snac_dirs["tiny"]).state_dict()
    for module in ("decoder.model.0", "decoder.model.2.block.1", "decoder.model.2.block.2.linear",
                   "quantizer.quantizers.1.out_proj"):
        g = raw[f"{module}.parametrizations.weight.original0"]
        v = raw[f"{module}.parametrizations.weight.original1"]
        expected = g * v / v.flatten(1).norm(dim=1).reshape(-1, 1, 1)
        torch.testing.assert_close(state[f"{module}.weight"], expected, rtol=1e-6, atol=1e-7)


def test_encoder_tensors_are_ignored_but_decoder_tensors_required(snac_dirs, tmp_path: Path) -> None:
    raw = torch.load(snac_dirs["tiny"] / "pytorch_model.bin", weights_only=True)
    config = (snac_dirs["tiny"] / "config.json").read_text()

    def write(name: str, state: dict) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config)
        torch.save(state, tmp_path / name / "pytorch_model.bin")
        return tmp_path / name

    no_encoder = {k: v for k, v in raw.items() if not k.startswith("encoder.") and ".in_proj." not in k}
    load_snac(write("no_encoder", no_encoder))

    missing = {k: v for k, v in raw.items() if not k.startswith("decoder.model.3.block.4.")}
    with pytest.raises(ValueError, match=r"missing tensor decoder\.model\.3\.block\.4\.block\.0\.alpha"):
        load_snac(write("missing", missing))

    half = {k: v for k, v in raw.items() if k != "decoder.model.7.parametrizations.weight.original0"}
    with pytest.raises(ValueError, match=r"decoder\.model\.7 lacks its weight-norm magnitude"):
        load_snac(write("half", half))

    extra = dict(raw, **{"decoder.model.9.bias": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unexpected tensor decoder\.model\.9\.bias"):
        load_snac(write("extra", extra))


@pytest.mark.parametrize("change, match", [
    ({"attn_window_size": 32}, "attn_window_size"),
    ({"attn_window_size": None, "window": 4}, "unknown key 'window'"),
    ({"decoder_rates": [8, 8, 4, 4]}, "decoder_rates"),
    ({"decoder_dim": 40}, "decoder_dim"),
    ({"noise": 1}, "noise"),
    ({"vq_strides": []}, "vq_strides"),
])
def test_bad_config_names_the_key(change: dict, match: str) -> None:
    config = json.loads(RELEASED_CONFIG)
    SNACConfig.from_dict(config)  # the released config itself is accepted
    with pytest.raises(ValueError, match=match):
        SNACConfig.from_dict({**config, **change})


def test_missing_attn_key_means_the_reference_default() -> None:
    with pytest.raises(ValueError, match="attn_window_size=32"):
        SNACConfig.from_dict({"encoder_rates": [2, 4, 8, 8], "decoder_rates": [8, 8, 4, 2]})


# --------------------------------------------------------------------------- decoding


def test_batch_rows_equal_solo_rows(snac_dirs) -> None:
    decoder = load_snac(snac_dirs["tiny"])
    rng = np.random.default_rng(5)
    codes = _as_tensors(_codes(rng, 4, 4))
    seeds = [window_noise_seed(r, 2) for r in range(4)]
    batch = decoder.decode(codes, seeds)
    solo = torch.cat([decoder.decode([level[b:b + 1] for level in codes], seeds[b:b + 1]) for b in range(4)])
    assert (batch - solo).abs().max().item() <= BATCH_TOLERANCE
    # torch's own CPU convolutions compute row by row, so without oneDNN the bits agree exactly:
    # the noise and everything else is per row
    # (the attribute, not mkldnn.flags(), which also sets a TF32 switch and warns about it)
    torch.backends.mkldnn.enabled = False
    try:
        batch = decoder.decode(codes, seeds)
        solo = torch.cat([decoder.decode([level[b:b + 1] for level in codes], seeds[b:b + 1]) for b in range(4)])
    finally:
        torch.backends.mkldnn.enabled = True
    assert torch.equal(batch, solo)


def test_seeds_drive_the_noise(snac_dirs) -> None:
    decoder = load_snac(snac_dirs["tiny"])
    codes = _as_tensors(_codes(np.random.default_rng(6), 1, 4))
    first = decoder.decode(codes, [11])
    assert torch.equal(first, decoder.decode(codes, [11]))  # no state kept between calls
    assert (first - decoder.decode(codes, [12])).abs().max().item() > 1e-3
    plain = load_snac(snac_dirs["plain"])  # noise: false
    assert torch.equal(plain.decode(codes, [11]), plain.decode(codes, [12]))


def test_bad_codes_are_value_errors(snac_dirs) -> None:
    decoder = load_snac(snac_dirs["tiny"])
    codes = _as_tensors(_codes(np.random.default_rng(7), 1, 2))
    with pytest.raises(ValueError, match="3 code levels"):
        decoder.decode(codes[:2], [0])
    with pytest.raises(ValueError, match=r"codes\[2\] has 3 steps"):
        decoder.decode([codes[0], codes[1], codes[2][:, :3]], [0])
    with pytest.raises(ValueError, match=r"codes\[1\] outside \[0, 4096\)"):
        decoder.decode([codes[0], codes[1] + 4096, codes[2]], [0])
    with pytest.raises(ValueError, match="int64"):
        decoder.decode([codes[0].int(), codes[1], codes[2]], [0])
    with pytest.raises(ValueError, match="2 seeds for 1 rows"):
        decoder.decode(codes, [0, 1])


def test_window_noise_seed() -> None:
    seeds = {window_noise_seed(request, window) for request in range(20) for window in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)
    assert window_noise_seed(2**64 - 1, 3) == window_noise_seed(-1, 3)  # seeds are read modulo 2**64
    assert window_noise_seed(5, 1) == window_noise_seed(5, 1) != window_noise_seed(1, 5)


def test_cli_writes_a_loadable_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    snac_random_main([str(tmp_path / "out"), "--size", "small", "--seed", "2"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    decoder = load_snac(tmp_path / "out")
    assert decoder.config.latent_dim == 64 and decoder.config.decoder_dim == 64
