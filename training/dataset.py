"""Read, validate and clean a contract-1 metrics table (the input of `training.fit`).

Collected metrics are messy: BMCs drop readings, exporters write `NaN`, people hand over CSVs
with utilisation in percent or the wrong column. A model trained on such rows is quietly wrong,
so this step owns the rule "never silently used, never silently lost":

- `read_metrics` reads CSV or Parquet (a file, or every `*.csv` / `*.parquet` in a directory)
  and remembers where every row came from (file and line), so errors can point at it.
- `clean_metrics` is pure: it parses timestamps to UTC and values to numbers, refuses input
  that is wrong as a whole (missing columns, utilisation in percent, a non-numeric column) with
  a `MetricsInputError` that says what and where, and drops bad rows one by one, counting them
  by reason and logging the first example of each.
- `load_metrics` does both.
- `stream_metrics` does both in batches, for fleets: the files of a directory are grouped so
  that each node's rows sit in one group (per-node or per-rack files make small groups), and
  each group is read and cleaned on its own, so memory follows the largest group, not the fleet.
- `write_metrics` writes a contract-1 table (CSV or Parquet), as `training.collect` and
  `training.synth` produce it.

A row with several problems is counted once, under the first reason in the order the checks
run (see `clean_metrics`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from livedata.metrics_table import (
    CONTRACT_COLUMNS,
    CPU2_TEMP_C,
    CPU_UTIL,
    FACT_COLUMNS,
    NODE,
    NUMERIC_FACT_COLUMNS,
    OPTIONAL_COLUMNS,
    POWER_W,
    TEMPERATURE_COLUMNS,
    TIMESTAMP,
    VALUE_COLUMNS,
)

log = logging.getLogger(__name__)

# The contract's column names live in livedata.metrics_table; these say how cleaning treats them.
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c for c in CONTRACT_COLUMNS if c not in OPTIONAL_COLUMNS)

MAX_POWER_W = 20_000.0  # no single node draws 20 kW: such a reading is a unit or sensor error
TEMPERATURE_RANGE_C = (-40.0, 150.0)  # what BMC sensors can physically report
# Unix seconds from 1970 to 2100; larger numbers are usually milliseconds.
UNIX_SECONDS_RANGE = (0.0, 4_102_444_800.0)
# A column that fails to parse in most of its non-empty cells is the wrong column, not noise.
MOSTLY_BAD_COLUMN_SHARE = 0.5
RIGHT_COLUMN = "is it the right column?"
# Utilisation is in percent when more than this share of values lies in (1.5, 100].
PERCENT_ROWS_SHARE = 0.05
PERCENT_LIKE_ABOVE = 1.5
EMPTY_TOKENS = frozenset({"", "nan", "null", "none", "na", "n/a"})
METRICS_SUFFIXES = (".csv", ".parquet")

# Provenance columns added by read_metrics: which file a row came from and where in it.
SOURCE_COLUMN = "_source_file"
LINE_COLUMN = "_source_line"


class MetricsInputError(ValueError):
    """Bad metrics input; the message names the file, line and field at fault."""


@dataclass
class CleanedMetrics:
    """The outcome of cleaning: usable rows plus an account of every row that was not used."""

    frame: pd.DataFrame  # contract columns; timestamp tz-aware UTC; sorted by node, timestamp
    rows_read: int
    dropped: dict[str, int]  # reason -> rows dropped (e.g. "power_w_negative")
    sources: list[str]
    examples: dict[str, str] = field(default_factory=dict)  # reason -> first dropped row

    @property
    def rows_kept(self) -> int:
        return len(self.frame)


# --------------------------------------------------------------------------------------------
# Reading (the only I/O in this module)


def read_metrics(path: str | Path) -> pd.DataFrame:
    """Read a CSV/Parquet file, or every `*.csv` / `*.parquet` in a directory (sorted by name).

    CSV cells are kept as text so that cleaning can quote a bad value exactly as written.
    Adds the provenance columns `_source_file` and `_source_line` (CSV: line in the file, the
    header being line 1; Parquet: row number from 1). Raises `MetricsInputError` for a missing
    path, an unreadable or empty file, or a file without the required columns.
    """
    return _read_files(metrics_files(path))


def metrics_files(path: str | Path) -> list[Path]:
    """The metrics files `path` names: itself, or a directory's `*.csv` / `*.parquet` by name."""
    path = Path(path)
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix.lower() in METRICS_SUFFIXES
        )
        if not files:
            raise MetricsInputError(f"directory {path} has no .csv or .parquet files")
        return files
    if path.is_file():
        if path.suffix.lower() not in METRICS_SUFFIXES:
            raise MetricsInputError(
                f"file {path}: unknown format {path.suffix!r}; give a .csv or .parquet file"
            )
        return [path]
    raise MetricsInputError(f"{path}: no such file or directory")


def _read_files(files: Sequence[Path]) -> pd.DataFrame:
    frames = [_read_one(file) for file in files]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _read_raw(
    file: Path, columns: Sequence[str] | None = None, *, header_only: bool = False
) -> pd.DataFrame:
    """A file's cells (CSV: as text), all columns or only `columns`, or with `header_only` no
    rows at all; errors name the file."""
    if file.suffix.lower() == ".csv":
        try:
            # skip_blank_lines=False keeps line numbers true to the file; blank lines are then
            # dropped (and counted) by cleaning.
            return pd.read_csv(
                file,
                dtype=str,
                keep_default_na=False,
                skip_blank_lines=False,
                usecols=columns,
                nrows=0 if header_only else None,
            )
        except pd.errors.EmptyDataError:
            raise MetricsInputError(f"file {file} is empty (no header, no rows)") from None
        except (pd.errors.ParserError, UnicodeDecodeError) as error:
            raise MetricsInputError(f"file {file}: not readable as CSV: {error}") from None
    try:
        if header_only:
            return pq.read_schema(file).empty_table().to_pandas()
        return pd.read_parquet(file, columns=None if columns is None else list(columns))
    except Exception as error:  # pyarrow raises several unrelated types for a bad file
        raise MetricsInputError(f"file {file}: not readable as Parquet: {error}") from None


def _read_one(file: Path) -> pd.DataFrame:
    frame = _read_raw(file)
    first_line = 2 if file.suffix.lower() == ".csv" else 1
    frame.columns = [str(column).strip() for column in frame.columns]
    check_columns(frame.columns, where=f"file {file}")
    if CPU2_TEMP_C not in frame.columns:
        log.info("file %s has no %s column: its nodes are taken as one-socket", file, CPU2_TEMP_C)
    if frame.empty:
        raise MetricsInputError(f"file {file} has no rows")
    frame[SOURCE_COLUMN] = str(file)
    frame[LINE_COLUMN] = np.arange(first_line, first_line + len(frame))
    return frame


def check_columns(columns: Sequence[str], *, where: str) -> None:
    """Raise when a required column is missing, naming what was found instead."""
    present = set(columns)
    missing = [column for column in REQUIRED_COLUMNS if column not in present]
    if not missing:
        return
    found = [c for c in columns if c not in (SOURCE_COLUMN, LINE_COLUMN)]
    message = (
        f"{where}: missing required column(s) {', '.join(missing)}; "
        f"found columns: {', '.join(found) or '(none)'}"
    )
    by_folded = {column.lower(): column for column in found}
    near = [f"{by_folded[m.lower()]!r} for {m!r}" for m in missing if m.lower() in by_folded]
    if near:
        message += f" (column names are case-sensitive: {', '.join(near)}?)"
    raise MetricsInputError(message)


def load_metrics(path: str | Path, *, cpu_util_percent: bool = False) -> CleanedMetrics:
    """`read_metrics` + `clean_metrics`."""
    return clean_metrics(read_metrics(path), source=str(path), cpu_util_percent=cpu_util_percent)


def _node_names_in(file: Path) -> set[str]:
    """The node names a file holds, reading only its header and its node column."""
    header = list(_read_raw(file, header_only=True).columns)
    stripped = [str(column).strip() for column in header]
    check_columns(stripped, where=f"file {file}")
    node_column = header[stripped.index(NODE)]
    names = _read_raw(file, columns=[node_column]).iloc[:, 0]
    return set(names.astype("string").str.strip().dropna().unique()) - {""}


@dataclass
class CleaningTally:
    """What cleaning did over several batches, summed: the input account of a training run."""

    rows_read: int = 0
    rows_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, batch: CleanedMetrics) -> None:
        self.rows_read += batch.rows_read
        self.rows_kept += batch.rows_kept
        for reason, count in batch.dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + count
        self.sources += [s for s in batch.sources if s not in self.sources]
        for reason, example in batch.examples.items():
            self.examples.setdefault(reason, example)


@dataclass(frozen=True)
class MetricsStream:
    """A metrics input read and cleaned one group of files at a time (see `stream_metrics`).

    Iterating yields one `CleanedMetrics` per group; every node's rows are in exactly one of
    them. `n_nodes` counts the distinct node names in the files (before cleaning). `source`, if
    set, names the input in messages and reports instead of the files (files that are only a
    temporary spill of something else, such as a Prometheus collection).
    """

    groups: tuple[tuple[Path, ...], ...]
    n_nodes: int
    cpu_util_percent: bool = False
    source: str | None = None

    def __iter__(self) -> Iterator[CleanedMetrics]:
        tally = CleaningTally()
        for group in self.groups:
            batch = self.read_group(group)
            tally.add(batch)
            yield batch
        if tally.rows_kept == 0:
            raise nothing_left_error(tally)
        log.info(
            "kept %d of %d rows from %d file(s) in %d group(s); dropped %d",
            tally.rows_kept,
            tally.rows_read,
            sum(len(group) for group in self.groups),
            len(self.groups),
            tally.rows_read - tally.rows_kept,
        )

    def read_group(self, group: Sequence[Path]) -> CleanedMetrics:
        """One group of files, read and cleaned (possibly empty: the stream judges the whole).
        A `training.fit --dask` worker reads its own group this way."""
        raw = _read_files(group)
        if self.source is not None:  # clean_metrics then names rows after `source`
            raw = raw.drop(columns=[SOURCE_COLUMN, LINE_COLUMN])
        return clean_metrics(
            raw,
            source=self.source or ", ".join(map(str, group)),
            cpu_util_percent=self.cpu_util_percent,
            allow_empty=True,
            log_summary=False,
        )


def stream_metrics(
    path: str | Path, *, cpu_util_percent: bool = False, source: str | None = None
) -> MetricsStream:
    """Plan reading `path` in groups of files that share no node (see `MetricsStream`).

    Only each file's header and node column are read here. Files that hold rows of the same
    node are put in one group (cleaning must see all of a node's rows to find duplicates and to
    sort them), so a directory of per-node or per-rack files streams in small groups, while
    daily files that each hold every node make one group: the whole table, as `load_metrics`.
    """
    files = metrics_files(path)
    parent = list(range(len(files)))  # union-find over files that share a node

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first_file_of: dict[str, int] = {}
    for index, file in enumerate(files):
        for node in _node_names_in(file):
            other = first_file_of.setdefault(node, index)
            parent[root(index)] = root(other)
    groups: dict[int, list[Path]] = {}
    for index, file in enumerate(files):
        groups.setdefault(root(index), []).append(file)
    return MetricsStream(
        groups=tuple(tuple(group) for group in groups.values()),
        n_nodes=len(first_file_of),
        cpu_util_percent=cpu_util_percent,
        source=source,
    )


def write_metrics(frame: pd.DataFrame, out: str | Path) -> None:
    """Write a contract-1 table to Parquet or CSV, chosen by `out`'s extension.

    CSV timestamps are written as RFC 3339 in UTC (with fractions of a second only when some
    timestamp has them), so `read_metrics` reads back what was written.
    """
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in METRICS_SUFFIXES:
        raise ValueError(f"--out must end in .parquet or .csv, got {out.name!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        frame.to_parquet(out, index=False)
        return
    stamps = frame[TIMESTAMP].dt.tz_convert("UTC")
    has_fraction = bool((stamps != stamps.dt.floor("s")).any())
    rfc3339 = "%Y-%m-%dT%H:%M:%S.%fZ" if has_fraction else "%Y-%m-%dT%H:%M:%SZ"
    frame.assign(timestamp=stamps.dt.strftime(rfc3339)).to_csv(out, index=False)


# --------------------------------------------------------------------------------------------
# Cleaning (pure)


class _Drops:
    """Tracks which rows are still alive and why the others were dropped."""

    def __init__(self, raw: pd.DataFrame, from_reader: bool) -> None:
        self.raw = raw
        self.from_reader = from_reader
        self.alive = np.ones(len(raw), dtype=bool)
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def drop(self, reason: str, mask: np.ndarray, column: str | None, note: str = "") -> None:
        hit = np.asarray(mask, dtype=bool) & self.alive
        count = int(hit.sum())
        if count == 0:
            return
        first = int(np.argmax(hit))
        example = self.place(first) if column is None else self.cell(first, column)
        if note:
            example += f" ({note})"
        self.counts[reason] = self.counts.get(reason, 0) + count
        self.examples.setdefault(reason, example)
        log.warning("dropped %d row(s): %s; first: %s", count, reason, example)
        self.alive &= ~hit

    def place(self, row: int) -> str:
        """'file X, line N' for CSV rows, 'file X, row N' for Parquet, 'X, row N' for frames."""
        source = self.raw[SOURCE_COLUMN].iloc[row]
        number = self.raw[LINE_COLUMN].iloc[row]
        if not self.from_reader:
            return f"{source}, row {number}"
        word = "line" if str(source).lower().endswith(".csv") else "row"
        return f"file {source}, {word} {number}"

    def cell(self, row: int, column: str) -> str:
        """Where a cell is and what it holds, as the user wrote it."""
        return (
            f"{self.place(row)}, field {column}: value {_cell_text(self.raw[column].iloc[row])!r}"
        )


def _cell_text(value: object) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return str(value)


def _empty_mask(column: pd.Series) -> np.ndarray:
    """Cells that hold no value: NaN/None, blank text, or a textual NaN/null."""
    if column.dtype == object or pd.api.types.is_string_dtype(column):
        text = column.astype("string").str.strip().str.lower()
        return (column.isna() | text.isin(EMPTY_TOKENS)).to_numpy(dtype=bool)
    return column.isna().to_numpy(dtype=bool)


def _parse_numeric(column: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values as float, empty mask, non-numeric mask)."""
    empty = _empty_mask(column)
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        values = column.to_numpy(dtype=float, na_value=np.nan)
        return values, empty | np.isnan(values), np.zeros(len(column), dtype=bool)
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    non_numeric = np.isnan(values) & ~empty
    return values, empty, non_numeric


def _parse_timestamps(
    column: pd.Series,
) -> tuple[pd.Series, np.ndarray, np.ndarray, np.ndarray]:
    """(UTC timestamps, empty mask, unparseable mask, Unix seconds out of range mask)."""
    n_rows = len(column)
    out_of_range = np.zeros(n_rows, dtype=bool)
    if isinstance(column.dtype, pd.DatetimeTZDtype):
        stamps = column.dt.tz_convert("UTC")
        return stamps, stamps.isna().to_numpy(), np.zeros(n_rows, dtype=bool), out_of_range
    if pd.api.types.is_datetime64_dtype(column):
        log.info("timestamps without a time zone are taken as UTC")
        stamps = column.dt.tz_localize("UTC")
        return stamps, stamps.isna().to_numpy(), np.zeros(n_rows, dtype=bool), out_of_range

    empty = _empty_mask(column)
    seconds, _, not_a_number = _parse_numeric(column)
    is_seconds = ~empty & ~not_a_number
    out_of_range = is_seconds & ~(
        (seconds >= UNIX_SECONDS_RANGE[0]) & (seconds <= UNIX_SECONDS_RANGE[1])
    )
    stamps = pd.Series(pd.NaT, index=column.index, dtype="datetime64[ns, UTC]")
    good_seconds = is_seconds & ~out_of_range
    if good_seconds.any():
        stamps[good_seconds] = pd.to_datetime(seconds[good_seconds], unit="s", utc=True)
    text_rows = ~empty & not_a_number
    if text_rows.any():
        text = column[text_rows].astype(str).str.strip()
        stamps[text_rows] = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    unparseable = text_rows & stamps.isna().to_numpy()
    return stamps, empty, unparseable, out_of_range


def clean_metrics(
    raw: pd.DataFrame,
    *,
    source: str,
    cpu_util_percent: bool = False,
    allow_empty: bool = False,
    log_summary: bool = True,
) -> CleanedMetrics:
    """Validate and clean a contract-1 table; pure (logs, but reads and writes nothing).

    `source` names the input in messages when `raw` did not come from `read_metrics`.
    `cpu_util_percent=True` divides utilisation by 100 first (for tables in percent).
    `allow_empty=True` returns an empty frame instead of raising when no row is left (one batch
    of a stream may be all bad; the stream judges the whole); `log_summary=False` leaves the
    "kept N of M rows" line to the caller.

    Raises `MetricsInputError` for input that is wrong as a whole: a missing required column,
    no rows, utilisation in percent (unless `cpu_util_percent`), a column that does not parse
    (as numbers, as times) in most rows, Unix timestamps in milliseconds, or no rows left.

    Drops rows, in this order, counting each under one reason: `blank_line`, `node_missing`,
    `timestamp_missing`, `timestamp_unparseable`, `timestamp_out_of_range`,
    `<field>_non_numeric`, `<field>_missing` (`cpu2_temp_c` may be empty), `power_w_negative`,
    `power_w_zero`, `power_w_absurd` (> 20 kW), `cpu_util_out_of_range` (outside 0..1),
    `<temperature>_out_of_range` (outside -40..150 C), `duplicate_timestamp` (same node and
    timestamp as an earlier row, which is kept).
    """
    raw = raw.reset_index(drop=True)
    from_reader = SOURCE_COLUMN in raw.columns and LINE_COLUMN in raw.columns
    if not from_reader:
        check_columns(raw.columns, where=source)
        raw = raw.assign(**{SOURCE_COLUMN: source, LINE_COLUMN: np.arange(1, len(raw) + 1)})
    if raw.empty:
        raise MetricsInputError(f"{source} has no rows")
    if CPU2_TEMP_C not in raw.columns:
        log.info("%s has no %s column: every node is taken as one-socket", source, CPU2_TEMP_C)
        raw = raw.assign(**{CPU2_TEMP_C: np.nan})

    source_of_row = raw[SOURCE_COLUMN].astype(str).to_numpy()
    sources = list(dict.fromkeys(source_of_row))
    drops = _Drops(raw, from_reader)

    contract_cells = np.column_stack([_empty_mask(raw[c]) for c in CONTRACT_COLUMNS])
    drops.drop("blank_line", contract_cells.all(axis=1), None)

    node = raw[NODE].astype("string").str.strip().fillna("").astype(object)
    drops.drop("node_missing", (node == "").to_numpy(dtype=bool), NODE)

    stamps, empty, unparseable, out_of_range = _parse_timestamps(raw[TIMESTAMP])
    for bad, problem, hint in (
        (unparseable, "is not an RFC 3339 time", RIGHT_COLUMN),
        (out_of_range, "is not Unix seconds (1970..2100)", "milliseconds? Give Unix seconds"),
    ):
        _refuse_mostly_bad_column(TIMESTAMP, bad, empty, drops, source_of_row, problem, hint)
    drops.drop("timestamp_missing", empty, TIMESTAMP)
    drops.drop("timestamp_unparseable", unparseable, TIMESTAMP)
    drops.drop("timestamp_out_of_range", out_of_range, TIMESTAMP, "Unix seconds 1970..2100")

    values: dict[str, np.ndarray] = {}
    for column in VALUE_COLUMNS:
        numbers, empty, non_numeric = _parse_numeric(raw[column])
        _refuse_mostly_bad_column(
            column, non_numeric, empty, drops, source_of_row, "is not a number", RIGHT_COLUMN
        )
        drops.drop(f"{column}_non_numeric", non_numeric, column)
        if column not in OPTIONAL_COLUMNS:
            drops.drop(f"{column}_missing", empty, column)
        values[column] = numbers

    util = values[CPU_UTIL]
    if cpu_util_percent:
        if np.nanmax(np.where(drops.alive, util, np.nan), initial=0.0) <= 1.0:
            log.warning("cpu_util_percent is set but every cpu_util is <= 1: already fractions?")
        util = util / 100.0
        values[CPU_UTIL] = util
    else:
        _refuse_percent_utilisation(util, drops, source_of_row)

    power_w = values[POWER_W]
    with np.errstate(invalid="ignore"):
        drops.drop("power_w_negative", power_w < 0, POWER_W)
        drops.drop("power_w_zero", power_w == 0, POWER_W, "a BMC reads 0 W when it has none")
        drops.drop("power_w_absurd", power_w > MAX_POWER_W, POWER_W, "over 20 kW")
        drops.drop("cpu_util_out_of_range", ~((util >= 0) & (util <= 1)), CPU_UTIL, "0..1")
        low_c, high_c = TEMPERATURE_RANGE_C
        for column in TEMPERATURE_COLUMNS:
            temp_c = values[column]
            outside = ~np.isnan(temp_c) & ~((temp_c >= low_c) & (temp_c <= high_c))
            drops.drop(f"{column}_out_of_range", outside, column, "-40..150 C")

    frame = pd.DataFrame({NODE: node, TIMESTAMP: stamps, **values})[list(CONTRACT_COLUMNS)]
    frame = frame.assign(**_fact_columns(raw, source_of_row))
    alive_index = np.flatnonzero(drops.alive)
    duplicate = np.zeros(len(raw), dtype=bool)
    repeated = frame.iloc[alive_index].duplicated([NODE, TIMESTAMP], keep="first").to_numpy()
    duplicate[alive_index[repeated]] = True
    drops.drop("duplicate_timestamp", duplicate, TIMESTAMP, "same node and timestamp as before")

    kept = frame[drops.alive].sort_values([NODE, TIMESTAMP], kind="stable")
    kept = kept.reset_index(drop=True)
    cleaned = CleanedMetrics(
        frame=kept,
        rows_read=len(raw),
        dropped=drops.counts,
        sources=sources,
        examples=drops.examples,
    )
    if kept.empty and not allow_empty:
        tally = CleaningTally()
        tally.add(cleaned)
        raise nothing_left_error(tally)
    if log_summary:
        log.info(
            "kept %d of %d rows (%d nodes) from %d source(s); dropped %d",
            len(kept),
            len(raw),
            kept[NODE].nunique(),
            len(sources),
            len(raw) - len(kept),
        )
    return cleaned


def _fact_columns(raw: pd.DataFrame, source_of_row: np.ndarray) -> dict[str, pd.Series]:
    """The optional node-fact columns the input has (`FACT_COLUMNS`), parsed: `cpu_model` as
    text, the others as positive numbers. An empty cell is unknown; a fact never drops a row,
    but a numeric fact column that is mostly not numbers is the wrong column and is refused."""
    facts: dict[str, pd.Series] = {}
    for column in FACT_COLUMNS:
        if column not in raw.columns:
            continue
        if column not in NUMERIC_FACT_COLUMNS:
            empty = _empty_mask(raw[column])
            facts[column] = pd.Series(
                [
                    None if gap else str(v).strip()
                    for v, gap in zip(raw[column], empty, strict=True)
                ],
                index=raw.index,
                dtype=object,
            )
            continue
        numbers, empty, non_numeric = _parse_numeric(raw[column])
        filled = int((~empty).sum())
        if filled and non_numeric.sum() > MOSTLY_BAD_COLUMN_SHARE * filled:
            first = int(np.argmax(non_numeric))
            raise MetricsInputError(
                f"{source_of_row[first]}: {column} {raw[column].iloc[first]!r} (row "
                f"{first + 1}) is not a number; so are {int(non_numeric.sum())} of its "
                f"{filled} non-empty values: {RIGHT_COLUMN}"
            )
        facts[column] = pd.Series(np.where(numbers > 0, numbers, np.nan), index=raw.index)
    return facts


def nothing_left_error(tally: CleaningTally) -> MetricsInputError:
    """The error for an input whose every row was dropped, for a person: the counts by reason
    first (largest first), then the input, then the first row of the largest reason."""
    ranked = sorted(tally.dropped.items(), key=lambda item: (-item[1], item[0]))
    counts = ", ".join(f"{count:,} {drop_reason_words(reason)}" for reason, count in ranked)
    message = (
        f"all {tally.rows_read:,} rows dropped, none left to fit: {counts or 'no reason'} "
        f"(input: {_sources_text(tally.sources)})"
    )
    if ranked and ranked[0][0] in tally.examples:
        top = ranked[0][0]
        message += f"; first row {drop_reason_words(top)}: {tally.examples[top]}"
    return MetricsInputError(message)


# Drop reasons are `<column>_<problem>` or a bare problem; how each problem reads in a sentence.
_PROBLEM_WORDS: tuple[tuple[str, str], ...] = (
    ("_non_numeric", "not a number"),
    ("_out_of_range", "out of range"),
    ("_unparseable", "unparseable"),
    ("_missing", "missing"),
    ("_negative", "negative"),
    ("_zero", "zero"),
    ("_absurd", "over 20 kW"),
)


def drop_reason_words(reason: str) -> str:
    """`power_w_negative` -> `power_w negative`: the column as named, the problem in words."""
    for suffix, words in _PROBLEM_WORDS:
        if reason.endswith(suffix) and len(reason) > len(suffix):
            return f"{reason[: -len(suffix)]} {words}"
    return reason.replace("_", " ")


def _sources_text(sources: Sequence[str], shown: int = 3) -> str:
    if len(sources) <= shown:
        return ", ".join(sources)
    return f"{', '.join(sources[:shown])} and {len(sources) - shown} more"


def _refuse_mostly_bad_column(
    column: str,
    bad: np.ndarray,
    empty: np.ndarray,
    drops: _Drops,
    source_of_row: np.ndarray,
    problem: str,
    hint: str,
) -> None:
    """A column that fails in most non-empty rows of a file is the wrong column (or unit), not
    noise: refuse it with an example instead of dropping the whole file row by row."""
    for source in np.unique(source_of_row[bad & drops.alive]):
        in_source = (source_of_row == source) & drops.alive
        filled = int((in_source & ~empty).sum())
        bad_in_source = in_source & bad
        if filled and bad_in_source.sum() > MOSTLY_BAD_COLUMN_SHARE * filled:
            first = int(np.argmax(bad_in_source))
            raise MetricsInputError(
                f"{drops.cell(first, column)} {problem}; so are {int(bad_in_source.sum())} of "
                f"the {filled} non-empty {column} values in {source}: {hint}"
            )


def _refuse_percent_utilisation(util: np.ndarray, drops: _Drops, source_of_row: np.ndarray) -> None:
    """Utilisation in 0..100 would be dropped as 'above 1' (or, worse, partly kept): refuse it.

    Values just above 1 are counter-rate glitches of fractional data, not percentages, so only
    values in (1.5, 100] count as percent-like; a lone one among many rows is a glitch too.
    """
    with np.errstate(invalid="ignore"):
        percent_like = drops.alive & (util > PERCENT_LIKE_ABOVE) & (util <= 100.0)
        for source in np.unique(source_of_row[percent_like]):
            in_source = (source_of_row == source) & drops.alive & ~np.isnan(util)
            valid = int(in_source.sum())
            suspects = percent_like & in_source
            count = int(suspects.sum())
            beyond_percent = int((in_source & ((util > 100.0) | (util < 0.0))).sum())
            looks_percent = count == valid or (count >= 2 and count > PERCENT_ROWS_SHARE * valid)
            if looks_percent and beyond_percent <= 0.01 * valid:
                first = int(np.argmax(suspects))
                raise MetricsInputError(
                    f"{source}: cpu_util looks like a percentage (0..100), not a fraction 0..1: "
                    f"{count} of {valid} values are above {PERCENT_LIKE_ABOVE:g}, "
                    f"e.g. {drops.cell(first, CPU_UTIL)}. Divide it by 100, or "
                    "pass cpu_util_percent=True (training.fit: --cpu-util-percent)"
                )
