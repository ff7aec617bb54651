"""`chatbox serve` refuses to start on a policy file with a mistake in it, and says what the
mistake is and where, without a traceback; a good file starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.chat.policy import default_policy_path
from tests.served import Served

CANARY = '\n[[routing.canary]]\nmodel = "tiny"\narm = "exp"\n'


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        (
            'tier = "fre"\npercent = 10',
            "tier 'fre' is not a tier of this policy (tiers: free, paid)",
        ),
        ('tier = "free"\npercent = 150', "percent must be a number from 0 to 100, not 150"),
        ('tier = "free"\npercent = 10\nprecent = 10', "unknown keys ['precent']"),
    ],
)
def test_serve_refuses_a_bad_canary_naming_the_problem_and_where(
    tmp_path: Path, tiny_gguf: Path, entry: str, said: str
) -> None:
    text = default_policy_path().read_text() + CANARY
    policy = tmp_path / "policy.toml"
    policy.write_text(text + entry + "\n")
    box = Served(tmp_path, model=tiny_gguf, policy=policy)
    with pytest.raises(AssertionError, match="chatbox serve exited"):
        box.start()
    assert box.proc is not None and box.proc.returncode == 1
    log = box.log()
    assert "Error: policy file " in log and "policy-on-tiny.toml" in log
    assert "[[routing.canary]] number 1 (arm 'exp')" in log and said in log, log
    assert "Traceback" not in log


def test_serve_refuses_an_unknown_key_in_the_overload_table(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    text = default_policy_path().read_text().replace("retry_after_s = 5", "retry_afer_s = 5")
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    box = Served(tmp_path, model=tiny_gguf, policy=policy)
    with pytest.raises(AssertionError, match="chatbox serve exited"):
        box.start()
    assert "[overload]: unknown keys ['retry_afer_s']" in box.log()
    assert "Traceback" not in box.log()


def test_serve_starts_with_a_good_canary(tmp_path: Path, tiny_gguf: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(default_policy_path().read_text() + CANARY + 'tier = "free"\npercent = 10\n')
    with Served(tmp_path, model=tiny_gguf, policy=policy) as box:
        assert box.proc is not None and box.proc.poll() is None
