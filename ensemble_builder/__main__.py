"""`python -m ensemble_builder build|check|list`."""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from ensemble_builder.build import build
from omni_backend.deploy import DeployError
from omni_backend.families import load_family, pipelines

REPO_DIR = Path(__file__).resolve().parent.parent / "model_repository"


def default_pipelines() -> list[str]:
    """Pipelines that run without a user checkpoint: the committed repository holds these."""
    return sorted(n for n, p in pipelines().items() if p.default_model)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def check(repo: Path) -> list[str]:
    """Differences between `repo` and a fresh build of the default pipelines."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in default_pipelines():
            build(name, tmp)
        fresh, have = _tree(Path(tmp)), _tree(repo) if repo.exists() else set()
        diffs = [f"missing: {f}" for f in sorted(fresh - have)]
        diffs += [f"not built by the builder: {f}" for f in sorted(have - fresh)]
        diffs += [f"differs: {f}" for f in sorted(fresh & have)
                  if not filecmp.cmp(Path(tmp) / f, repo / f, shallow=False)]
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ensemble_builder")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write a Triton model repository for a pipeline")
    b.add_argument("--pipeline", action="append", help="pipeline name (repeatable)")
    b.add_argument("--all", action="store_true", help="every pipeline that has a default model")
    b.add_argument("--deploy", help="deploy YAML (default: deploy/<pipeline>.yaml)")
    b.add_argument("--model", help="checkpoint folder (default: the pipeline's built-in model)")
    b.add_argument("--out", default=str(REPO_DIR), help="model repository folder")
    b.add_argument("--family", action="append", default=[],
                   help="module of a model family outside omni_backend/models (repeatable)")
    c = sub.add_parser("check", help="fail when the committed model_repository/ is stale")
    c.add_argument("--repo", default=str(REPO_DIR))
    sub.add_parser("list", help="list pipelines")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            for name, p in sorted(pipelines().items()):
                print(f"{name:28s} {' -> '.join(s.model_stage for s in p.stages):32s} {p.description}")
            return 0
        if args.cmd == "check":
            diffs = check(Path(args.repo))
            for d in diffs:
                print(d)
            if diffs:
                print(f"{args.repo} is stale: run `python -m ensemble_builder build --all`", file=sys.stderr)
                return 1
            print(f"{args.repo} is up to date")
            return 0
        for module in args.family:
            load_family(module)
        names = default_pipelines() if args.all else (args.pipeline or [])
        if not names:
            ap.error("build needs --pipeline NAME or --all")
        if (args.deploy or args.model) and len(names) != 1:
            ap.error("--deploy and --model apply to one --pipeline")
        for name in names:
            for folder in build(name, args.out, args.deploy, args.model):
                print(f"wrote {folder}")
        return 0
    except (DeployError, ValueError, KeyError, ImportError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
