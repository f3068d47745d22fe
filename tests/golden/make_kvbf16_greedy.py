"""Record tests/golden/smollm2_kvbf16_greedy.json: SmolLM2-135M-Instruct exported with
``--kv-cache-dtype bf16`` (bf16 recipe), cpu backend, the golden prompts' STEPS greedy ids
(the Driver) and their HTTP chat answers (ids up to EOS, text), exactly as
tests/e2e/test_kv_bf16_real.py computes them.

    uv run python tests/golden/make_kvbf16_greedy.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from helios_ignition.export import export_core  # noqa: E402
from helios_tools.core import generate_key, load_public_key, open_core, write_key_pair  # noqa: E402

from tests.conftest import NAMESPACE, RECIPE  # noqa: E402
from tests.e2e.test_kv_bf16_real import EXPECTED, GOLDENS, STEPS, greedy_ids, http_answers  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        private, public = write_key_pair(generate_key(), Path(folder) / "publisher.key")
        out = Path(folder) / "smollm2-kvbf16.core"
        export_core(RECIPE, checkpoint="smollm2", key_path=private, namespace=NAMESPACE,
                    out=out, weight_dtype="bf16", kv_cache_dtype="bf16")
        core = open_core(out, [load_public_key(public)])
        direct = greedy_ids(core)
        answers = http_answers(out, public)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    names = [p["name"] for p in json.loads(GOLDENS.read_text())["prompts"]]
    record = {
        "about": "SmolLM2-135M-Instruct exported --kv-cache-dtype bf16 (bf16 recipe), cpu "
                 f"backend: each golden prompt's {STEPS} greedy ids (Driver) and its HTTP chat "
                 f"answer up to its EOS. Recorded at {commit} by "
                 "tests/golden/make_kvbf16_greedy.py (tests/e2e/test_kv_bf16_real.py checks "
                 "them).",
        "prompts": [{"name": n, "ids": ids, "http_ids": a[0], "http_text": a[1]}
                    for n, ids, a in zip(names, direct, answers, strict=True)],
    }
    EXPECTED.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
