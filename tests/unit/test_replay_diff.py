"""streams/replay/diff.py: aligning two runs' steps and telling decisions from results and wording."""

from __future__ import annotations

import json

from agentstream.streams.replay.diff import decision, diff_runs, percentile, window_report


def model(index: int, action: dict, **result) -> dict:
    return {"index": index, "kind": "model", "status": "completed", "request": {"messages": 2},
            "result": {"text": json.dumps(action), "prompt_tokens": 10, "completion_tokens": 5, "ttft_ms": 20.0,
                       **result}, "error": None, "total_ms": 100.0}


def tool(index: int, name: str, arguments: dict, result: str) -> dict:
    return {"index": index, "kind": "tool", "status": "completed", "request": {"tool": name, "arguments": arguments},
            "result": {"tool": name, "ok": True, "result": result}, "error": None, "total_ms": 5.0}


def run(run_id: str, steps: list[dict], answer: str = "42", status: str = "completed") -> dict:
    return {"run_id": run_id, "status": status, "answer": answer if status == "completed" else None,
            "error_code": None if status == "completed" else "max_steps", "steps": steps}


def calc(expression: str, result: str, answer: str = "42") -> list[dict]:
    return [model(0, {"action": "tool", "tool": "calculator", "arguments": {"expression": expression}}),
            tool(1, "calculator", {"expression": expression}, result),
            model(2, {"action": "final_answer", "answer": answer})]


def test_identical_runs_have_the_same_decisions():
    d = diff_runs(run("a", calc("6 * 7", "42")), run("b", calc("6 * 7", "42")))
    assert not d.decisions_changed and d.changed_steps == []
    assert [s.status for s in d.steps] == ["same", "same", "same"]


def test_a_changed_tool_argument_is_a_changed_decision_at_that_step():
    d = diff_runs(run("a", calc("6 * 7", "42")), run("b", calc("6 * 8", "42")))
    assert d.decisions_changed
    assert d.changed_steps == [0, 1]  # the model chose other arguments; the tool was called with them
    step = d.steps[1]
    assert step.status == "changed" and any("arguments" in n and "6 * 8" in n for n in step.notes)
    assert d.steps[2].status == "same"


def test_a_different_result_with_the_same_decisions_is_not_a_regression():
    d = diff_runs(run("a", calc("6 * 7", "42")), run("b", calc("6 * 7", "43")))
    assert not d.decisions_changed
    assert d.steps[1].status == "result" and d.steps[1].result_changed


def test_wording_and_timings_do_not_change_decisions():
    a = run("a", [model(0, {"action": "final_answer", "answer": "42"})])
    b = run("b", [{**model(0, {"answer": "42", "action": "final_answer"}), "total_ms": 900.0}])
    b["steps"][0]["result"]["text"] = "Sure! " + b["steps"][0]["result"]["text"]
    d = diff_runs(a, b)
    assert not d.decisions_changed
    assert d.steps[0].total_ms_a == 100.0 and d.steps[0].total_ms_b == 900.0
    assert "same action, different wording" in d.steps[0].notes


def test_missing_steps_and_outcomes_count_as_changes():
    short = run("b", calc("6 * 7", "42")[:2], status="failed")
    d = diff_runs(run("a", calc("6 * 7", "42")), short)
    assert d.decisions_changed and d.outcome_changed
    assert d.steps[2].status == "only_a"
    other = diff_runs(run("a", calc("1", "1", answer="x"), answer="x"), run("b", calc("1", "1", answer="y"), answer="y"))
    assert other.outcome_changed and other.changed_steps == [2]


def test_decisions_of_every_kind():
    assert decision({"kind": "retrieval", "request": {"query": "kafka"}}) == ("retrieval", "kafka")
    assert decision({"kind": "prefetch", "request": {"query": "task"}}) == ("prefetch", "task")
    assert decision({"kind": "model", "result": {"text": "no json here"}}) == ("model", "unparseable")
    assert decision({"kind": "model", "error": "boom", "result": {}}) == ("model", "error", "boom")
    # arguments compare as JSON values, whatever their key order
    assert decision(tool(1, "t", {"a": 1, "b": 2}, "")) == decision(tool(1, "t", {"b": 2, "a": 1}, ""))


def test_window_report_aggregates():
    a1, b1 = run("a1", calc("6 * 7", "42")), run("b1", calc("6 * 7", "42"))
    a2, b2 = run("a2", calc("6 * 7", "42")), run("b2", calc("6 * 9", "54"), status="failed")
    b2["steps"][0]["result"]["ttft_ms"] = 80.0
    report = window_report([(a1, b1), (a2, b2)]).to_dict()
    assert report["runs"] == 2 and report["decisions_changed"] == 1
    assert report["changed_runs"] == [{"original": "a2", "rerun": "b2"}]
    assert report["completed"] == {"original": 2, "rerun": 1} and report["failed"] == {"original": 0, "rerun": 1}
    assert report["tokens"]["delta"] == 0
    assert report["ttft_p50_ms"]["original"] == 20.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([], 0.5) is None


def _call(index: int, child: str, task: str) -> dict:
    return {"index": index, "kind": "tool", "status": "completed",
            "request": {"agent": "research@1", "task": task, "child_run_id": child},
            "result": {"ok": True, "result": "found"}, "error": None, "total_ms": 50.0}


def test_two_trees_are_compared_child_by_child_under_their_parents_steps():
    from agentstream.streams.replay.diff import diff_tree

    ask = model(0, {"action": "tool", "tool": "agent__research", "arguments": {"task": "look"}})
    answer = model(2, {"action": "final_answer", "answer": "42"})
    runs = {"a": run("a", [ask, _call(1, "ca", "look"), answer]), "b": run("b", [ask, _call(1, "cb", "look"), answer]),
            "ca": run("ca", calc("1 + 1", "2")), "cb": run("cb", calc("1 + 2", "3"))}
    tree = diff_tree(runs["a"], runs["b"], lambda x, y: runs)
    assert not tree.run.decisions_changed  # the parents decided the same ...
    assert tree.changed and tree.children[1].run.changed_steps == [0, 1]  # ... their children did not
    assert tree.to_dict()["children"][1]["run_b"] == "cb"
    other = run("b", [ask, _call(1, "cb", "look elsewhere"), answer])
    assert diff_tree(runs["a"], other, lambda x, y: {}).run.changed_steps == [1]  # a sub-agent asked otherwise
