"""How the chaos suite prints its result: a summary table, and the end of every log when a check fails."""

from __future__ import annotations

from pathlib import Path

from agentstream.devstack import process
from agentstream.devstack.private import PrivateStack
from bench.chaos.chaos_procs import TAIL_LINES


def print_summary(result: dict) -> None:
    keys = ("runs", "completed", "lost", "stuck", "duplicated_effects", "duplicated_events",
            "snapshot_regressions", "dead_letters", "failed_without_reason", "session_violations", "tree_violations")
    print(f"chaos suite ({result['mode']}, {result.get('stack', 'default')}): "
          f"{'every check holds' if result['ok'] else 'CHECKS FAILED'}")
    for key in keys:
        by_cell = "  (" + ", ".join(f"{cell} {c[key]}" for cell, c in result["cells"].items()) + ")" \
            if result.get("cells") else ""
        print(f"  {key:<24} {result[key]}{by_cell}")
    print(f"  {'failed_by':<24} {result['failed_by']}")
    if result.get("sessions"):
        print(f"  {'sessions':<24} {result['sessions']['turns']} turns of {result['sessions']['sessions']} "
              "conversations, each transcript checked")
    print("  runs by kind (expected → seen):")
    for name, k in result["by_kind"].items():
        print(f"    {name:<12} {k['runs']:>4} runs, expect {k['expect']:<18} {k['outcomes']}")
    print("  faults (s after the load started; recovery: to the next completed run):")
    recovery = list(result["recovery_s"].values())
    for n, f in enumerate(result["faults"]):
        rec = recovery[n] if n < len(recovery) else None
        err = f"  ERROR {f['error']}" if f["error"] else ""
        print(f"    {f['start_s']:>7.1f} → {f['end_s'] if f['end_s'] is not None else '?':>7}  {f['fault']:<30} "
              f"{f['completed_during']:>4} completed meanwhile, recovery {rec if rec is not None else '—'} s{err}")
    for letter in result["dead_letter_reasons"][:10]:
        print(f"  dead letter {letter.get('consumer')} {letter.get('source')} {letter.get('error_kind')}: "
              f"{letter.get('reason', '')[:160]}")
    for e in result["worker_exits"][:15]:
        cause = next((line for line in reversed(e["log_tail"]) if "Error" in line or "error" in line), "")
        print(f"  exit {e['process']} rc={e['returncode']} at {e['at_s']} s (up {e['uptime_s']} s, during "
              f"{', '.join(e['during']) or 'no fault'}): {cause.strip()[:140]}")
    load = result["load"]
    print(f"  load: {load['submitted']} submitted in {load['submit_phase_s']} s; retries: submit "
          f"{load['submit_retries']}, approval {load['approval_retries']} (+{load['approval_poll_errors']} polls), "
          f"cancel {load['cancel_retries']}")


def logs_dir(stack: PrivateStack) -> Path:
    """The processes' logs live in the stack's state directory, next to Kafka's and PostgreSQL's."""
    return stack.paths.state_dir / "logs"


def print_tails(stack: PrivateStack | None) -> None:
    """The end of every process's log: what a failed check needs to be explained."""
    logs = sorted(logs_dir(stack).glob("*.log")) if stack is not None else []
    if stack is not None:
        logs += [stack.kafka.log_file, stack.postgres.log_file]
    for log in logs:
        print(f"----- {log.name} (last {TAIL_LINES} lines) -----\n{process.log_tail(log, TAIL_LINES)}")
