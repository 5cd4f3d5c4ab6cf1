#!/usr/bin/env python
"""Builds TF Serving's test SavedModels (and optionally synthetic addk_i models) into DEST.

    python scripts/make_models.py DEST [--synthetic N --size-mb S]
    python scripts/make_models.py --triton DEST [--synthetic N --padding-mb S --sleep-ms T]
    python scripts/make_models.py --mlserver DEST [--synthetic N --padding-mb S --mlserver-python PY]

DEST/half_plus_two/{00000123,00000124}, DEST/half_plus_three/00000123,
DEST/half_plus_two_tf2/00000123, ...; with --synthetic N also DEST/addk_1 ..
DEST/addk_N (version 1, y = x + k, about S MB each). See tests/support/models/tfserving.py.

With --triton, DEST is a Triton model repository of python-backend models instead (no
tensorflow): addk_1 .. addk_N (input x, output y = x + k, FP32; each holding S MB while
loaded) and, with --sleep-ms T, sleep_ms (y = x after T ms). See tests/support/models/triton.py.

With --mlserver, DEST is an MLServer model repository instead, trained by MLServer's own
interpreter (--mlserver-python, default .mlserver/bin/python): addk_1 .. addk_N (scikit-learn,
predict = x + k), sk_clf, xgb_reg and, with --padding-mb S, addk_pad holding S MB while loaded.
See tests/support/models/mlserver.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the test models live with the tests (tests/support/models/), not in the wheel
REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, nargs="?", help="directory to build the models into")
    parser.add_argument("--triton", type=Path, metavar="DEST",
                        help="build a Triton model repository (python backend) into DEST instead")
    parser.add_argument("--mlserver", type=Path, metavar="DEST",
                        help="build an MLServer model repository (scikit-learn, XGBoost) into DEST instead, "
                             "with MLServer's interpreter (--mlserver-python)")
    parser.add_argument("--mlserver-python", type=Path, default=Path(".mlserver/bin/python"),
                        help="--mlserver: the python of MLServer's environment (default .mlserver/bin/python, "
                             "made by scripts/install_mlserver.sh)")
    parser.add_argument("--padding-mb", type=float, default=0.0, metavar="S",
                        help="--triton: memory each addk model holds while loaded, in MB")
    parser.add_argument("--sleep-ms", type=int, default=None, metavar="T",
                        help="--triton: also build sleep_ms, sleeping T ms per request")
    parser.add_argument("--synthetic", type=int, default=0, metavar="N",
                        help="also build addk_1 .. addk_N")
    parser.add_argument("--size-mb", type=float, default=0.0, metavar="S",
                        help="size of each synthetic model in MB (default 0: tiny)")
    parser.add_argument("--no-test-models", action="store_true",
                        help="build only the synthetic models")
    args = parser.parse_args(argv)
    if sum(x is not None for x in (args.dest, args.triton, args.mlserver)) != 1:
        parser.error("give one of DEST (TF Serving models), --triton DEST or --mlserver DEST")
    if args.mlserver is not None:
        from support.models.mlserver import build_mlserver_models

        for name in build_mlserver_models(args.mlserver, args.mlserver_python, synthetic=args.synthetic,
                                          padding_bytes=int(args.padding_mb * 1_000_000)):
            print(f"{name}\t{args.mlserver / name}")
        return 0
    if args.triton is not None:
        return _triton(args)

    from support.models import tfserving as testmodels  # imports tensorflow: seconds

    args.dest.mkdir(parents=True, exist_ok=True)
    built = {} if args.no_test_models else testmodels.build_test_models(args.dest)
    size = int(args.size_mb * 1_000_000)
    for k in range(1, args.synthetic + 1):
        built[f"addk_{k}"] = testmodels.build_addk(args.dest, k, size)
    for name, base in built.items():
        print(f"{name}\t{base}")
    return 0


def _triton(args: argparse.Namespace) -> int:
    from support.models import triton as tritonmodels

    built = tritonmodels.build_triton_models(args.triton, synthetic=args.synthetic,
                                             padding_bytes=int(args.padding_mb * 1_000_000),
                                             sleep_ms=args.sleep_ms)
    for name, path in built.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
