"""Properties of the pure retry function."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from shoal.queue.retry import RetryPolicy, after_failure, retry_delay
from shoal.queue.states import FINISHED_STATES, TRANSITIONS, JobState

NOW = datetime(2026, 1, 1, tzinfo=UTC)
policies = st.builds(
    RetryPolicy,
    retry_limit=st.integers(0, 50),
    retry_delay=st.timedeltas(timedelta(0), timedelta(hours=1)),
    retry_backoff=st.booleans(),
    retry_delay_max=st.timedeltas(timedelta(0), timedelta(days=1)),
)


@given(policies, st.integers(1, 200), st.integers(0, 2**32))
def test_attempts_never_pass_the_limit(policy: RetryPolicy, attempt: int, seed: int) -> None:
    step = after_failure(attempt, policy, NOW, random.Random(seed))
    if attempt > policy.retry_limit:
        assert step.state is JobState.FAILED and step.start_after is None
    else:
        assert step.state is JobState.RETRY and step.start_after is not None


@given(policies, st.integers(1, 200), st.integers(0, 2**32))
def test_delay_is_never_negative_nor_past_the_cap(
    policy: RetryPolicy, attempt: int, seed: int
) -> None:
    delay = retry_delay(attempt, policy, random.Random(seed))
    assert timedelta(0) <= delay <= max(policy.retry_delay_max, timedelta(0))


@given(policies, st.integers(1, 200))
def test_permanent_errors_fail_at_once(policy: RetryPolicy, attempt: int) -> None:
    assert (
        after_failure(attempt, policy, NOW, random.Random(), permanent=True).state
        is JobState.FAILED
    )


def test_backoff_doubles_within_equal_jitter() -> None:
    policy = RetryPolicy(10, timedelta(seconds=2), True, timedelta(hours=1))
    for attempt in range(1, 8):
        full = timedelta(seconds=2 * 2 ** (attempt - 1))
        low = retry_delay(attempt, policy, _Fixed(0.0))
        high = retry_delay(attempt, policy, _Fixed(0.999999))
        assert low == full / 2 and full / 2 < high < full


@given(policies, st.integers(1, 200), st.booleans(), st.integers(0, 2**32))
def test_a_failed_attempt_leaves_active_by_an_allowed_edge_within_the_delay_cap(
    policy: RetryPolicy, attempt: int, permanent: bool, seed: int
) -> None:
    step = after_failure(attempt, policy, NOW, random.Random(seed), permanent=permanent)
    assert step.state in TRANSITIONS[JobState.ACTIVE]
    if step.state in FINISHED_STATES:
        # Finished by the policy: nothing brings it back but an explicit command.
        assert step.start_after is None
        assert JobState.ACTIVE not in TRANSITIONS[step.state]
    else:
        assert step.start_after is not None
        assert NOW <= step.start_after <= NOW + policy.retry_delay_max


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_state_diagram_in_docs_matches_the_transitions() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "queue.md").read_text()
    drawn = set(re.findall(r"^\s+(\w+) --> (\w+)$", text, re.MULTILINE))
    declared = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    assert drawn == declared
