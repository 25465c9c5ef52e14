"""What a decision on a tool call achieved (``AgentClient.approve``/``deny``), and why one is refused.

The first decision on a step stands (``agentstream_decide``, migrations 0011 and 0015): a call's own
decision is not always the step's, so the client returns the one that holds and the CLI prints it
(``agentstream/cli/approvals.py``), instead of what was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

#: The SQLSTATE ``agentstream_decide`` raises for ``NotAwaitingApproval`` (migration 0015).
NOT_AWAITING_APPROVAL = "ZA001"


@dataclass(frozen=True)
class Decision:
    """What ``approve``/``deny`` achieved: the decision that holds for the step, which is not always the
    one asked for — the first decision on a step stands, so a deny after an approval leaves the tool to
    run. With ``approvals = recorded`` it is read back from ``approval_decisions``; with ``open`` nothing
    is recorded, the decision was only announced, and whether it counts is the planner's to find out (it
    takes the first decision it reads while the run waits at the step)."""

    run_id: str
    step_id: str
    #: What this call asked for (True: approve).
    asked: bool
    #: The decision on the step: the recorded one, or (``open``) the one announced.
    approved: bool
    reason: str
    #: The approver's database login (``recorded``); with ``open``, whatever the caller said.
    decided_by: str
    #: When it was recorded; None with ``open``.
    decided_at: datetime | None
    #: Read back from the database (``approvals = recorded``); False: only announced (``open``).
    recorded: bool
    #: An earlier decision stands and this call's was not recorded (a retry, or a second approver).
    earlier: bool = False

    @property
    def as_asked(self) -> bool:
        """The step's decision is what this call asked for (by this call or an earlier, equal one)."""
        return self.approved == self.asked
