"""The retrieval section of metrics.json under both protocols, and how the report shows it: one
table per protocol, the winning arm of each metric in bold and named, hir/best per protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from hir.data.snapshot import load_snapshot
from hir_evaluation.report.render import clean, html_page, markdown, print_summary, retrieval_rows
from hir_evaluation.retrieval.arms.content import ContentProfile
from hir_evaluation.retrieval.arms.gfcf import GFCF
from hir_evaluation.retrieval.arms.hir import HirSearch
from hir_evaluation.retrieval.arms.itemknn import ItemKNN
from hir_evaluation.retrieval.arms.popularity import Popularity
from hir_evaluation.retrieval.arms.repeat import Repeat
from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.evaluate import MASKED, best_arms, best_baseline_ratio, evaluate_retrieval
from hir_evaluation.retrieval.hir_search import files_topk
from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.sources.content import load_content
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.fixtures import shipped_arm, write_content, write_export

KS = (1, 3)
METRICS = [f"{m}@{k}" for k in KS for m in ("recall", "ndcg")]
ARMS = {"hir": HirSearch(), "popularity": Popularity(), "itemknn": ItemKNN(neighbours=3),
        "lightgcn": shipped_arm("retrieval", "lightgcn", dim=4, batch_size=16, steps_per_epoch=2, max_epochs=3,
                                patience=1, min_epochs=1),
        "content": ContentProfile(), "repeat": Repeat(), "gfcf": GFCF(rank=2, ideal_weight=0.3)}
ROLES = {"hir": "model", "popularity": "baseline", "itemknn": "baseline", "lightgcn": "baseline",
         "content": "baseline", "repeat": "reference", "gfcf": "baseline"}


def test_best_arm_and_ratio() -> None:
    section = {"hir": {"recall@20": 0.3}, "popularity": {"recall@20": 0.1}, "itemknn": {"recall@20": 0.2},
               "lightgcn": {"recall@20": None}, "repeat": {"recall@20": 0.5}}
    assert best_arms(section, tuple(ARMS), ["recall@20", "ndcg@20"]) == {"recall@20": "repeat", "ndcg@20": None}
    baselines = ("popularity", "itemknn", "lightgcn", "content", "gfcf")
    ratio = best_baseline_ratio(section, "recall@20", baselines)
    assert ratio["best_baseline"] == "itemknn" and ratio["ratio"] == pytest.approx(1.5) and ratio["hir"] == 0.3
    assert best_baseline_ratio({"hir": {"recall@20": 0.3}}, "recall@20", baselines)["ratio"] is None


@pytest.fixture
def retrieval(tiny_graph: Path, tmp_path: Path) -> dict:
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1)
    write_content(tiny_graph, tmp_path / "content", dim=8)
    snap = load_snapshot(tiny_graph)
    content = load_content(tmp_path / "content", "product", snap.num_nodes("product"))
    # as metrics.json holds it (NaN -> null)
    return clean(evaluate_retrieval(snap, RetrievalTask(ks=KS), ARMS, 0, files_topk(tmp_path / "embeddings", snap, "product"),
                                    content, history_splits=["train"]))


def test_both_protocols_for_every_arm(retrieval: dict) -> None:
    masked = retrieval[MASKED]
    # tiny.py: test purchases (0, 2) and (1, 3); only product 2 is new to its user, so one user is scored
    assert retrieval["users"] == 2 and masked["users"] == 1
    assert retrieval["arms"] == ROLES  # the registry's roles, in its order, for the report
    for arm in ("hir", "popularity", "itemknn", "lightgcn", "content", "gfcf"):
        assert set(METRICS) <= set(retrieval[arm]) and set(METRICS) <= set(masked[arm])
        assert masked[arm]["recall@3"] is not None
        assert masked["slices"]["item_cold"][arm]["recall@3"] is None  # no item-cold purchase in tiny.py
    assert all(v is None for v in masked["repeat"].values()) and "repeat" in masked["skipped"]
    assert retrieval["repeat"]["recall@1"] is not None
    deep = retrieval["deep_funnel"]
    for arm in ARMS:  # every arm has a deep-funnel list, repeat included
        assert deep[arm]["hr@3"] is not None, arm
        for name in ("repeat", "explore"):
            assert set(METRICS) <= set(deep["slices"][name][arm])
    # tiny.py: user 0's test purchase 2 is new (explore), user 1's 3 was bought before (repeat)
    assert deep["users"] == 2 and deep["slices"]["repeat"]["users"] == 1 and deep["slices"]["explore"]["users"] == 1
    assert retrieval["slices"]["repeat"]["users"] == 1
    assert deep["slices"]["repeat"]["popularity"]["recall@3"] == 0.0  # the re-bought 3 is masked
    assert set(deep["best"]) == set(METRICS) | {f"hr@{k}" for k in KS}
    for section in (retrieval, masked):
        assert set(section["best"]) == set(METRICS)
        for metric, arm in section["best"].items():
            assert section[arm][metric] == max(v[metric] for a, v in section.items()
                                               if a in ARMS and v[metric] is not None)
        assert section["hir_over_best_baseline"]["metric"] == "recall@20"
    fit = retrieval["fits"]["lightgcn"]
    assert fit["selection"] == f"{MASKED} val recall@20"
    assert [c["epoch"] for c in fit["curve"]] == list(range(1, fit["epochs"] + 1))
    assert {"epoch", "seconds", "loss", "val_recall@20", "val_recall@20_full"} <= set(fit["curve"][0])


def _metrics() -> dict:
    arm = {"hir": 0.2, "popularity": 0.1, "itemknn": 0.3, "lightgcn": 0.25, "content": 0.05, "repeat": 0.4, "gfcf": 0.15}
    full = {a: {m: v for m in METRICS} for a, v in arm.items()}
    masked = {a: {m: v / 2 for m in METRICS} for a, v in arm.items() if a != "repeat"}
    masked["repeat"] = dict.fromkeys(METRICS)
    masked["hir"] = {m: 0.5 for m in METRICS}  # hir wins the masked protocol
    section = {"ks": list(KS), "users": 10, "history_splits": ["train"], "protocol": "full catalogue", "arms": ROLES, **full,
               "best": dict.fromkeys(METRICS, "repeat"),
               "hir_over_best_baseline": {"metric": "recall@20", "best_baseline": "itemknn", "ratio": 0.2 / 0.3},
               "slices": {"item_cold": {"users": 3, **full}},
               MASKED: {"protocol": "masked", "users": 8, **masked, "skipped": {"repeat": "ranks only history"},
                        "best": dict.fromkeys(METRICS, "hir"), "slices": {"item_cold": {"users": 2, **masked}},
                        "hir_over_best_baseline": {"metric": "recall@20", "best_baseline": "itemknn",
                                                   "ratio": 0.5 / 0.15}},
               "fits": {"lightgcn": {"best_epoch": 7, "epochs": 12, "best_val_recall@20": 0.1, "seconds": 30.0,
                                     "stopped_by": "patience", "stopped_by_budget": False,
                                     "selection": f"{MASKED} val recall@20"}}}
    return {"dataset": "tiny", "retrieval": section, "ranking": {}, "diagnostics": {}, "sources": {}}


def test_report_shows_both_tables_and_names_the_winner(capsys: pytest.CaptureFixture[str]) -> None:
    m = _metrics()
    md = markdown(m, {})
    assert "### Retrieval, full catalogue" in md and f"### Retrieval, {MASKED}" in md
    assert "hir / best baseline (itemknn) recall@20 = 0.667" in md and "= 3.333" in md
    masked_rows = retrieval_rows(m["retrieval"][MASKED], list(KS), ROLES)
    assert [r[0] for r in masked_rows] == [*ROLES, "best"]  # every registered arm, in its order
    assert masked_rows[0][:2] == ["hir", "**0.5000**"]  # the winner in bold
    assert masked_rows[-1] == ["best", *["hir"] * len(METRICS)]
    assert masked_rows[-3][:2] == ["repeat", "skipped"] and "repeat skipped: ranks only history." in md
    assert "| gfcf | 0.1500 |" in md and "gfcf recall@20" in md
    assert "| best | repeat | repeat |" in md
    assert "masked/item_cold" in md and "best epoch 7 of 12" in md and "at its val plateau" in md
    page = html_page(md, {}, "t")
    assert "<strong>0.5000</strong>" in page and "**0.5000**" not in page
    print_summary(m, Path("report"))
    out = capsys.readouterr().out
    assert "full catalogue" in out and MASKED in out and "3.333" in out


def test_report_of_an_older_metrics_file_has_one_table() -> None:
    m = _metrics()
    for key in (MASKED, "arms", "gfcf"):  # written before the masked protocol and the registry
        del m["retrieval"][key]
    md = markdown(m, {})
    assert md.count("### Retrieval") == 1 and "### Retrieval, full catalogue" in md
    assert "masked/" not in md and "gfcf" not in md
    assert "| repeat | **0.4000** |" in md and "hir / best baseline (itemknn) recall@20 = 0.667" in md


@pytest.mark.parametrize(("ratio", "verdict"), [(1.5, "**Yes.**"), (1.003, "**About level**"), (0.9, "**No.**")])
def test_the_retrieval_answer_calls_no_win_inside_two_percent(ratio: float, verdict: str) -> None:
    from hir_evaluation.report.headline import retrieval_answer

    best = {"metric": "recall@20", "best_baseline": "gfcf", "best_value": 0.02, "hir": 0.02 * ratio, "ratio": ratio}
    answer = retrieval_answer({MASKED: {"hir_over_best_baseline": best}})
    assert answer.startswith(verdict) and f"{ratio:.2f}× the best baseline (gfcf, 0.0200)" in answer


def test_arms_with_inputs_run_before_the_background_join(tiny_graph: Path, tmp_path: Path, retrieval: dict) -> None:
    # evaluate joins the background baselines only before the first arm they fit: hir and content
    # run first; the section (its figures, its order) is the one without a join
    snap = load_snapshot(tiny_graph)
    content = load_content(tmp_path / "content", "product", snap.num_nodes("product"))
    exact = files_topk(tmp_path / "embeddings", snap, "product")
    events: list[str] = []

    def hir(data: RetrievalData, k: int) -> Ranked:
        events.append("hir")
        return exact(data, k)

    got = clean(evaluate_retrieval(snap, RetrievalTask(ks=KS), ARMS, 0, hir, content, history_splits=["train"],
                                   wait=lambda: events.append("join")))
    assert events == ["hir", "join"]
    assert list(got["seconds"]) == list(ARMS)

    def untimed(x: object) -> object:  # wall times (any "seconds" key, at any depth) differ run to run
        if isinstance(x, dict):
            return {k: untimed(v) for k, v in x.items() if "second" not in k}
        return [untimed(v) for v in x] if isinstance(x, list) else x

    assert untimed(got) == untimed(retrieval)
