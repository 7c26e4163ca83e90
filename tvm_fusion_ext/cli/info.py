"""``tvm-fusion info ARTIFACT [--json] [--no-verify]``: what an artifact takes and gives, how it was built, and
whether this machine can load it (every reason if not), without loading it. Runtime-only, like ``run`` on an
artifact: it works under ``TVM_USE_RUNTIME_LIB=1``, on the machine the artifact is deployed to."""

from __future__ import annotations

import json
import sys


def cmd_info(args) -> int:
    from ..deploy.describe import describe, format_description

    info = describe(args.artifact, verify=not args.no_verify)
    print(json.dumps(info, indent=2) if args.json else format_description(info))
    if info["here"]["loadable"]:
        return 0
    # a script gating a deployment on this command gets the loader's own one-line refusal and exit code 2
    print(f"error: {info['here']['problems'][0]}", file=sys.stderr)
    return 2


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="describe an artifact (inputs, symbolic dims and bounds, target, versions, "
                                    "fusion, records) and check that this machine can load it")
    p.add_argument("artifact", help="artifact directory from `tvm-fusion compile`")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.add_argument("--no-verify", action="store_true",
                   help="check file sizes but not their sha256 (which reads every byte of the weights)")
    p.set_defaults(func=cmd_info)
