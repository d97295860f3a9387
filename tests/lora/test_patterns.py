"""A config's regular expressions: refused or matched in linear time, never backtracked.

Issue 35, High 4: ``rank_pattern={"l(.|.)*Z": 4}`` held the registry for 15 s at
upload, and every agent for 12 s. No test here times anything: the slow cases run in
a subprocess whose generous timeout only turns a hang into a failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter, peft_config, safetensors_bytes
from loraplane.lora import parse_lora_config, validate_adapter_dir
from loraplane.lora.patterns import (
    MAX_KEY_PATHS,
    MAX_MODULE_CHARS,
    PatternError,
    compile_pattern,
    key_paths,
    layers_pattern_source,
    rank_key_source,
)
from loraplane.lora.tensors import layer_index
from tests.lora.util import expect_refusal

PATHOLOGICAL = [r"l(.|.)*Z", r"(a+)+$", r"(a|aa)*b"]
# Names on which Python's re takes exponential time with those patterns.
LONG_NAMES = ["l" + "x" * 60, "a" * 60 + "!", "a" * 60]


def _bytes(**extra: Any) -> bytes:
    return json.dumps(peft_config(extra=extra)).encode()


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter; a hang fails the test instead of stalling it."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("field", ["rank_pattern", "alpha_pattern"])
@pytest.mark.parametrize("key", PATHOLOGICAL)
def test_backtracking_keys_are_refused(field: str, key: str) -> None:
    # vLLM matches these keys with Python's re for every module it loads: refused here.
    error = expect_refusal("invalid_config", parse_lora_config, _bytes(**{field: {key: 4}}))
    assert error.detail["field"] == field
    assert error.detail["reason"] == "pattern_refused"
    assert repr(key) in error.message


@pytest.mark.parametrize(
    "key",
    [
        "(a|a)" * 12 + "b",  # alternatives in sequence: 2**12 paths
        "a?" * 12 + "a" * 12,  # optional items in sequence: 2**12 paths
        r".*\..*\..*",  # three unbounded repetitions
        r"(?=q)q_proj",  # look-ahead
        r"(q)\1",  # back-reference
        r"(?i)Q_PROJ",  # flags
        "q_proj\n",  # not printable
        "a{,3}",  # {,n}: RE2 reads it as text, Python as {0,n}
        "a)|(b",  # closes PEFT's own group around the key
        "(" * 300 + "a" + ")" * 300,  # once a RecursionError, a 500
    ],
)
def test_keys_outside_the_grammar_are_refused(key: str) -> None:
    error = expect_refusal("invalid_config", parse_lora_config, _bytes(rank_pattern={key: 4}))
    assert error.detail["reason"] == "pattern_refused"


@pytest.mark.parametrize(
    ("key", "paths"),
    [
        ("q_proj", 1),
        ("model.layers.0.self_attn.q_proj", 1),
        (r"model\.layers\.0\.self_attn\.q_proj", 1),
        ("^model.decoder.layers.0.encoder_attn.k_proj", 1),
        (r"layers\.(0|1|2)\.self_attn\.(q|v)_proj", 6),
        (r"mlp\..*", MAX_MODULE_CHARS + 1),
        (r"layers\.\d+\.mlp\.down_proj", MAX_MODULE_CHARS),
        (r"(?:k|v)_proj", 2),
        (r"[qkv]_proj", 1),
    ],
)
def test_keys_real_configs_use_are_accepted(key: str, paths: int) -> None:
    assert key_paths(key) == paths <= MAX_KEY_PATHS
    parse_lora_config(_bytes(rank_pattern={key: 4}, alpha_pattern={key: 8}))


@pytest.mark.parametrize(("pattern", "name"), list(zip(PATHOLOGICAL, LONG_NAMES, strict=True)))
def test_target_regexes_are_matched_in_linear_time(pattern: str, name: str) -> None:
    # target_modules / exclude_modules as a regex are matched only here (vLLM never does),
    # so they are accepted, and matched by RE2.
    config = parse_lora_config(_bytes(target_modules=pattern, exclude_modules=pattern))
    assert config.target_modules == pattern
    assert type(compile_pattern(pattern)._re2).__module__ == "re2"
    out = _run(f"""
        from loraplane.lora.tensors import _matches
        from loraplane.lora.patterns import compile_pattern, rank_key_source
        print(_matches({pattern!r}, {name!r}),
              compile_pattern(rank_key_source({pattern!r})).match({name!r}))
    """)
    assert out.split() == ["False", "False"]


def test_an_adapter_with_a_pathological_target_regex_validates_promptly(tmp_path: Path) -> None:
    # The module names hold the long run that makes Python's re backtrack.
    folder = make_adapter(tmp_path / "a", targets=("q_proj",), layers=1)
    module = "model.layers.0.self_attn.q_proj"
    long_module = "l" + "x" * 40
    weights = (folder / "adapter_model.safetensors").read_bytes()
    renamed = weights.replace(module.encode(), long_module[: len(module)].encode())
    assert renamed != weights
    config = json.loads((folder / "adapter_config.json").read_text())
    config["target_modules"] = r"l(.|.)*Z|l(.|.)*x"
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(renamed)
    out = _run(f"""
        from loraplane.lora import validate_adapter_dir
        print(validate_adapter_dir({str(folder)!r}).target_modules)
    """)
    assert out.strip() == str((long_module[: len(module)],))


KEYS = [
    "q_proj", "v_proj", r"self_attn\.q_proj", "layers.1.self_attn.q_proj", r"layers\.\d\.mlp\..*",
    "^model.layers.0.mlp.up_proj", r"(q|k)_proj", "proj", ".*_proj", r"[0-9]\.mlp",
    r"model\.layers\.1\.self_attn\.v_proj$", "mlp..*", "x?q_proj",
]
NAMES = [
    "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj",
    "model.layers.1.self_attn.xq_proj", "model.layers.0.mlp.up_proj",
    "model.layers.3.mlp.down_proj",
    "q_proj", "b", "layers.1.self_attn.q_proj", "model.layers.10.mlp.gate_proj",
]


@pytest.mark.parametrize("key", KEYS)
def test_rank_keys_match_exactly_as_peft(key: str) -> None:
    key_paths(key)
    for name in NAMES:
        peft = re.match(rf"(.*\.)?({key})$", name) is not None
        assert compile_pattern(rank_key_source(key)).match(name) is peft, (key, name)


@pytest.mark.parametrize(
    "pattern",
    [r".*\.(q|v)_proj", r"model\.layers\.\d+\.self_attn\.q_proj", r".*mlp.*", "q_proj",
     r"^(model\.)?layers\.[0-3]\..*proj$", r".*?\.(?P<x>up|down)_proj"],
)
def test_target_regexes_match_exactly_as_python(pattern: str) -> None:
    for name in NAMES:
        python = re.fullmatch(pattern, name) is not None
        assert compile_pattern(pattern).fullmatch(name) is python, (pattern, name)


@pytest.mark.parametrize("layers_pattern", [("layers",), ("h", "layers"), (r"lay\w+",)])
def test_layer_index_matches_as_peft(layers_pattern: tuple[str, ...]) -> None:
    for name in [*NAMES, "transformer.h.7.attn.c_attn"]:
        expected = None
        for item in layers_pattern:
            found = re.match(layers_pattern_source(item), name)
            if found is not None:
                expected = int(found.group("idx"))
                break
        assert layer_index(name, layers_pattern) == expected, name


@pytest.mark.parametrize(
    ("field", "value"),
    [("lora_alpha", 1e308), ("lora_alpha", 1e-300), ("lora_alpha", 1e7), ("lora_alpha", -1),
     ("alpha_pattern", {"q_proj": 1e308}), ("alpha_pattern", {"q_proj": 1e-300})],
)
def test_alpha_is_bounded(field: str, value: Any) -> None:
    error = expect_refusal("invalid_config", parse_lora_config, _bytes(**{field: value}))
    assert error.detail == {"field": field, "min": 1e-6, "max": 1e6}


@pytest.mark.parametrize("alpha", [1e-6, 0.5, 16, 1e6])
def test_alpha_within_bounds_is_accepted(alpha: float) -> None:
    assert parse_lora_config(_bytes(lora_alpha=alpha, alpha_pattern={"q": alpha})).lora_alpha \
        == alpha


def test_the_agents_validation_refuses_an_extreme_alpha(tmp_path: Path) -> None:
    folder = make_adapter(tmp_path / "a", alpha=1e308)
    expect_refusal("invalid_config", validate_adapter_dir, folder)


def test_too_many_key_module_pairs_are_refused() -> None:
    keys = {f"layers\\.{i}\\.mlp\\..*": 4 for i in range(200)}
    config = parse_lora_config(_bytes(rank_pattern=keys))
    modules = [f"model.layers.{i}.mlp.up_proj" for i in range(2000)]
    config.check_pattern_work(modules[:10])
    error = expect_refusal("invalid_config", config.check_pattern_work, modules)
    assert error.detail["field"] == "rank_pattern"
    assert error.detail["pattern_paths"] > error.detail["max_pattern_paths"]


@pytest.mark.parametrize(
    "module",
    ["model.layers.0.self_attn.q_proj\n", "model.layers.0.self_attn.q_pröj",
     "model.layers.0.self attn.q_proj", "m." * MAX_MODULE_CHARS + "q_proj",
     "model.layers.0.\u202eq_proj"],
)
def test_odd_module_paths_are_refused(tmp_path: Path, module: str) -> None:
    path = tmp_path / "adapter_model.safetensors"
    path.write_bytes(safetensors_bytes({
        f"base_model.model.{module}.lora_A.weight":
            {"dtype": "F32", "shape": [1, 1], "data_offsets": [0, 4]},
        f"base_model.model.{module}.lora_B.weight":
            {"dtype": "F32", "shape": [1, 1], "data_offsets": [4, 8]},
    }, data=b"\0" * 8))
    (tmp_path / "adapter_config.json").write_bytes(
        json.dumps(peft_config(rank=1, targets=["q_proj", "q_pröj"])).encode())
    expect_refusal("tensor_mismatch", validate_adapter_dir, tmp_path)


@pytest.mark.parametrize("field", ["target_modules", "exclude_modules", "layers_pattern"])
def test_deeply_nested_patterns_are_refused(field: str) -> None:
    nested = "(" * 500 + "a" + ")" * 500
    expect_refusal("invalid_config", parse_lora_config, _bytes(**{field: nested}))


def test_compile_refusals_say_why() -> None:
    with pytest.raises(PatternError, match="RE2"):
        compile_pattern(r"(?<=a)b")
    with pytest.raises(PatternError, match="POSIX"):
        compile_pattern("[[:alpha:]]")
    with pytest.raises(PatternError, match="not a valid regular expression"):
        compile_pattern("(unclosed")
