"""The summary table as text, Markdown and CSV records (rows from :mod:`reporting.stats`)."""
from __future__ import annotations

from typing import Any, Sequence

from reporting.stats import MISSING, SUMMARY_COLUMNS, AlgorithmSummary, SummaryColumn

WHOSE_ACCURACY = {True: "personal models", False: "global model", None: "unknown"}


def shown_columns(summaries: Sequence[AlgorithmSummary]) -> list[SummaryColumn]:
    """The columns of a table: those always shown, and the others some row has."""
    return [c for c in SUMMARY_COLUMNS if c.always or any(c.key in s.stats for s in summaries)]


def column_header(column: SummaryColumn, avg_last: int, target_acc: float | None) -> str:
    target = "target" if target_acc is None else f"{100 * target_acc:g}%"
    return column.header.format(n=avg_last, target=target)


def format_cell(summary: AlgorithmSummary, column: SummaryColumn) -> str:
    """``mean ± std`` over the runs (percent for accuracies), ``(k/n)`` when only k of the n runs
    have the figure, "–" when none has it."""
    stat = summary.stats.get(column.key)
    if stat is None:
        return MISSING
    if stat.count == 0:
        return f"{column.none_text} (0/{summary.n_runs})" if column.none_text != MISSING else MISSING
    if column.kind == "acc":
        text = f"{100 * stat.mean:.2f} ± {100 * stat.std:.2f}"
    elif column.kind == "gain":
        text = f"{100 * stat.mean:+.2f} ± {100 * stat.std:.2f}"
    elif column.kind == "count":
        text = f"{stat.mean:.1f} ± {stat.std:.1f}"
    else:
        text = f"{stat.mean:.3g} ± {stat.std:.2g}" if summary.n_runs > 1 else f"{stat.mean:.3g}"
    if stat.count < summary.n_runs:
        text += f" ({stat.count}/{summary.n_runs})"
    return text


def summary_cells(summaries: Sequence[AlgorithmSummary], avg_last: int = 10,
                  target_acc: float | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and text cells of the table: algorithm, runs, evaluations, last round, (whose
    accuracy, unless every row is a global model's), the figures, (unfinished runs)."""
    columns = shown_columns(summaries)
    whose = any(s.personalized is not False for s in summaries)
    any_unfinished = any(s.unfinished for s in summaries)
    any_collapsed = any(s.collapsed for s in summaries)
    measures = any(s.metric != "accuracy" for s in summaries)  # a multi-label dataset's recall@5
    header = ["algorithm", "runs", "evals", "last round"]
    header += ["acc is"] if measures else []
    header += ["acc of"] if whose else []
    header += [column_header(c, avg_last, target_acc) for c in columns]
    header += ["unfinished"] if any_unfinished else []
    header += ["collapsed"] if any_collapsed else []
    rows = []
    for s in summaries:
        evals = str(s.n_evals[0]) if s.n_evals[0] == s.n_evals[1] else f"{s.n_evals[0]}-{s.n_evals[1]}"
        row = [s.algorithm, str(s.n_runs), evals, str(s.last_round)]
        row += [s.metric] if measures else []
        row += [WHOSE_ACCURACY[s.personalized]] if whose else []
        row += [format_cell(s, c) for c in columns]
        row += [f"{s.unfinished} of {s.n_runs}" if s.unfinished else ""] if any_unfinished else []
        row += [f"{s.collapsed} of {s.n_runs}" if s.collapsed else ""] if any_collapsed else []
        rows.append(row)
    return header, rows


def table_title(dataset: str, goal: str) -> str:
    return f"{dataset} (goal: {goal}): mean ± population std over the runs (-t repeats)"


def format_summary_table(summaries: Sequence[AlgorithmSummary], dataset: str, goal: str,
                         avg_last: int = 10, target_acc: float | None = None) -> str:
    """The table as aligned plain text, one row per algorithm, under a title line."""
    header, rows = summary_cells(summaries, avg_last, target_acc)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    lines = [table_title(dataset, goal), line(header), line(["-" * w for w in widths]), *map(line, rows)]
    if any(s.unfinished for s in summaries):
        lines.append("unfinished: runs interrupted before their last round (their file says finished = False)")
    if any(s.collapsed for s in summaries):
        lines.append("collapsed: runs whose model diverged (NaN/inf) as the run measured (under the attack they "
                     "faced, or with --record_divergence); their figures are those before the collapse (the "
                     "file's diverged_round)")
    return "\n".join(lines)


def format_summary_markdown(summaries: Sequence[AlgorithmSummary], dataset: str, goal: str,
                            avg_last: int = 10, target_acc: float | None = None) -> str:
    """The table in Markdown, followed by how each figure shown was computed."""
    header, rows = summary_cells(summaries, avg_last, target_acc)

    def escape(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = [f"### {table_title(dataset, goal)}", "",
             "| " + " | ".join(map(escape, header)) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in rows]
    lines += [""] + [f"- {column_header(c, avg_last, target_acc)}: {c.note}" for c in shown_columns(summaries)]
    return "\n".join(lines)


def summary_records(summaries: Sequence[AlgorithmSummary]) -> list[dict[str, Any]]:
    """One flat dict per row for CSV files: identity, then ``<key>_mean``, ``<key>_std`` and
    ``<key>_runs`` of every figure (empty where missing), fractions as stored."""
    records = []
    for s in summaries:
        record: dict[str, Any] = {
            "dataset": s.dataset, "goal": s.goal, "algorithm": s.algorithm, "runs": s.n_runs,
            "unfinished": s.unfinished, "collapsed": s.collapsed, "evals_min": s.n_evals[0], "evals_max": s.n_evals[1],
            "last_round": s.last_round, "accuracy_of": WHOSE_ACCURACY[s.personalized], "metric": s.metric,
        }
        for column in SUMMARY_COLUMNS:
            stat = s.stats.get(column.key)
            known = stat is not None and stat.count > 0
            record[f"{column.key}_mean"] = repr(stat.mean) if known else ""
            record[f"{column.key}_std"] = repr(stat.std) if known else ""
            record[f"{column.key}_runs"] = 0 if stat is None else stat.count
        records.append(record)
    return records
