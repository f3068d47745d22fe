"""bench/serve_load.py's prompt builder on the real SmolLM2 core: a shared system turn of
exactly the asked length that is a token prefix of every prompt built behind it, prompts of
exactly the workload's input tokens, the refusals of a turn or prompt that cannot fit, and
what a level can reuse (`common_prefix`, `expected_reuse`), and the script's one-line
refusals (exit status 2) of a prefix run it cannot make."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helios_serve.bootstrap import Bootstrap

from tests.bench.scripts import BENCH, load_script


@pytest.fixture(scope="module")
def serve_load():
    return load_script("serve_load.py")


@pytest.fixture(scope="module")
def bootstrap(smollm2_core_bf16):
    core = smollm2_core_bf16
    with Bootstrap.load(core.path, [core.public_key], core.namespace) as boot:
        yield boot


def _ids(boot, text: str) -> list[int]:
    return boot.tokenizer.encode(text, add_special_tokens=False).ids


def _render(boot, messages: list[dict], generation: bool) -> str:
    from helios_tools.frontend_assets import render_chat

    return render_chat(boot.chat_template, messages, add_generation_prompt=generation,
                       **boot.template_variables)


def test_a_shared_system_turn_is_exactly_its_tokens_and_every_prompt_starts_with_it(
        serve_load, bootstrap):
    maker = serve_load.PromptMaker(bootstrap, seed=7)
    system = maker.system(256)
    turn = _ids(bootstrap, _render(bootstrap, [{"role": "system", "content": system}], False))
    assert len(turn) == 256
    assert maker.system_turn(system) == turn
    prompts = []
    for _ in range(3):
        messages = serve_load.conversation(maker.make(320, system), system)
        assert [m["role"] for m in messages] == ["system", "user"]
        assert messages[0]["content"] == system
        ids = _ids(bootstrap, _render(bootstrap, messages, True))
        assert len(ids) == 320
        assert ids[:256] == turn
        assert maker.prompt_ids(messages) == ids
        prompts.append(ids)
    # The turn, then the user turn's opening "<|im_start|>user\n" (3 tokens); the user
    # messages' own random text differs from its first token on.
    assert serve_load.common_prefix(prompts) == 259


def test_without_a_system_message_the_prompt_is_the_user_turn_alone(serve_load, bootstrap):
    maker = serve_load.PromptMaker(bootstrap, seed=7)
    messages = serve_load.conversation(maker.make(128))
    assert [m["role"] for m in messages] == ["user"]
    assert len(maker.prompt_ids(messages)) == 128


def test_the_same_seed_builds_the_same_turns_and_others_differ(serve_load, bootstrap):
    a, b = (serve_load.PromptMaker(bootstrap, seed=3) for _ in range(2))
    first = a.system(64)
    assert first == b.system(64)
    assert a.make(100, first) == b.make(100, first)
    assert a.system(64) != first  # the next draw: an unshared turn of the same length
    assert len(a.system_turn(a.system(64))) == 64


def test_a_turn_or_prompt_that_cannot_fit_is_refused(serve_load, bootstrap):
    maker = serve_load.PromptMaker(bootstrap, seed=0)
    empty = len(maker.system_turn(""))
    assert empty == 5  # "<|im_start|>system\n<|im_end|>\n"
    with pytest.raises(ValueError, match=f"^a 5-token system turn: the template's empty "
                                         f"system turn alone is {empty} tokens$"):
        maker.system(5)
    system = maker.system(296)
    with pytest.raises(ValueError, match="^300 input tokens <= the 305 tokens of the chat "
                                         "template and a 296-token system turn with an "
                                         "empty user message$"):
        maker.make(300, system)
    assert len(maker.prompt_ids(serve_load.conversation(maker.make(306, system),
                                                        system))) == 306


def test_common_prefix_counts_the_leading_ids_all_share(serve_load):
    assert serve_load.common_prefix([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7]]) == 2
    assert serve_load.common_prefix([[5, 6], [5, 6, 7]]) == 2
    assert serve_load.common_prefix([[1], [2]]) == 0


def test_expected_reuse_takes_pages_or_the_system_turn_snapshot(serve_load, bootstrap):
    # SmolLM2: 16-token pages, 64 snapshot rows, a boundary after system messages.
    snap = serve_load.expected_reuse(bootstrap, 253, 250, 320, 4)
    assert snap == {"system_turn_tokens": 250, "common_prefix_tokens": 253,
                    "page_tokens": 16, "page_aligned_tokens": 240,
                    "page_aligned_fraction": 0.75, "system_turn_snapshot": True,
                    "reusable_tokens": 250, "max_hit_fraction": 250 / 320,
                    "first_miss_fraction": 750 / 1280}
    # Pages past the snapshot's endpoint win (the cache restores a snapshot only beyond
    # the complete pages it matched).
    pages = serve_load.expected_reuse(bootstrap, 257, 254, 320, 4)
    assert (pages["reusable_tokens"], pages["page_aligned_tokens"]) == (256, 256)
    unshared = serve_load.expected_reuse(bootstrap, 3, None, 320, 4)
    assert (unshared["system_turn_snapshot"], unshared["reusable_tokens"],
            unshared["max_hit_fraction"], unshared["first_miss_fraction"]) == (False, 0, 0, 0)


@pytest.mark.parametrize(("options", "line"), [
    (["--shared-prefix", "0"], "--shared-prefix 0: must be a positive token count"),
    (["--prefix-baseline"],
     "--prefix-baseline compares against --shared-prefix TOKENS: give both"),
    (["--shared-prefix", "64", "--concurrency", "1", "--rounds", "1", "--min-requests", "1"],
     "--shared-prefix needs 2 requests per level at least (--rounds, --min-requests): one "
     "request shares its prefix with nobody"),
    (["--shared-prefix", "4"],
     "--shared-prefix 4: a 4-token system turn: the template's empty system turn alone is "
     "5 tokens"),
    (["--shared-prefix", "296"],
     "--shared-prefix 296 leaves no room for a user message in --workload 300/16: 300 "
     "input tokens <= the 305 tokens of the chat template and a 296-token system turn "
     "with an empty user message"),
])
def test_the_script_refuses_a_prefix_run_it_cannot_make_in_one_line_with_status_2(
        smollm2_core_bf16, tmp_path, options, line):
    core = smollm2_core_bf16
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "serve_load.py"), "--core", str(core.path), "--trust",
         str(core.public_key), "--accept", core.namespace, "--no-native", "--workload",
         "300/16", "--json", str(out), *options],
        capture_output=True, text=True, check=False, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"serve_load: {line}\n")
    assert not out.exists()  # refused before any server or level
