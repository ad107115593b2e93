#!/usr/bin/env python3
"""python-stats: the chosen statistic (mean, median, stdev, min, max) of each numeric column of a CSV
(or of the given columns) -> stats.json and stats.csv. Standard library only; streams its input
(median keeps the column's values as packed doubles, 8 bytes each).
Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.
CSV rules shared with summary.mjs and r_report.R (test/e2e/programs.test.ts has the table): UTF-8
only (a leading byte-order mark is dropped), RFC 4180 quoting, LF or CRLF line ends, blank lines
ignored, every record as long as the header; cells are trimmed of spaces, tabs, CR and LF; "" and NA
are missing; NaN/Inf/Infinity (any case, signed) and numbers beyond the double range are missing too
and counted in a note; a column is numeric when it has a number and no text. A statistic that a
double cannot hold is null, with the note "<method> overflows" in "notes" (by column)."""
import argparse
import array
import codecs
import csv
import json
import math
import os
import re
import sys

METHODS = ("mean", "median", "stdev", "min", "max")
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)\Z", re.IGNORECASE)
WHITESPACE = " \t\r\n"
csv.field_size_limit(2**31 - 1)


def emit(event):
    sys.stdout.write(json.dumps(event, allow_nan=False) + "\n")
    sys.stdout.flush()


def die(code, message):
    sys.stderr.write(message + "\n")
    sys.exit(code)


class ArgError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgError(message)


def parse_params(raw):
    try:
        params = json.loads(raw)
    except ValueError:
        die(2, "--params is not JSON")
    if not isinstance(params, dict):
        die(2, "--params must be an object")
    unknown = set(params) - {"method", "columns"}
    if unknown:
        die(2, "unknown parameters: " + ", ".join(sorted(unknown)))
    method = params.get("method")
    if method not in METHODS:
        die(2, "method must be one of " + ", ".join(METHODS))
    columns = params.get("columns")
    if columns is not None and (
        not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns)
    ):
        die(2, "columns must be a non-empty list of names")
    return method, columns


def lines(path, size, progress):
    """Decoded lines of the file (split at LF only), reporting bytes read; refuses binary and non-UTF-8
    input; drops a leading byte-order mark."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    read = 0
    with open(path, "rb") as f:
        for raw in f:
            read += len(raw)
            if b"\x00" in raw:
                die(3, "the input is binary, not CSV")
            try:
                text = decoder.decode(raw)
            except UnicodeDecodeError:
                die(3, "the input is not UTF-8 text")
            progress(read / max(size, 1))
            yield text
    try:
        tail = decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        die(3, "the input is not UTF-8 text")
    if tail:
        yield tail


class Column:
    """Running statistics on values divided by `scale`, a power of two near the largest magnitude seen:
    the division is exact, and neither the sum nor Welford's sum of squares can overflow where the
    statistic itself is representable."""

    def __init__(self, name, keep_values):
        self.name = name
        self.n = 0
        self.text = 0
        self.non_finite = 0
        self.scale = 0.0
        self.sum = 0.0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.values = array.array("d") if keep_values else None

    def add(self, x):
        if self.scale == 0.0 or abs(x) >= 2 * self.scale:
            if x != 0.0:
                scale = math.ldexp(1.0, math.frexp(x)[1] - 1)
                f = self.scale / scale
                self.sum *= f
                self.mean *= f
                self.m2 *= f * f
                self.scale = scale
        y = x / self.scale if self.scale else 0.0
        self.n += 1
        self.sum += y
        delta = y - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (y - self.mean)
        self.min = min(self.min, x)
        self.max = max(self.max, x)
        if self.values is not None:
            self.values.append(x)

    def result(self, method):
        if method == "mean":
            return self.sum / self.n * self.scale
        if method == "min":
            return self.min
        if method == "max":
            return self.max
        if method == "stdev":
            return math.sqrt(self.m2 / (self.n - 1)) * self.scale if self.n > 1 else None
        values = sorted(self.values)
        half = len(values) // 2
        if len(values) % 2:
            return values[half]
        a, b = values[half - 1], values[half]
        return (a + b) / 2 if math.isfinite(a + b) else a / 2 + b / 2

    def notes(self, method, value):
        notes = []
        if value is not None and not math.isfinite(value):
            notes.append("%s overflows" % method)
        if self.non_finite:
            notes.append("%d NaN/Infinity values treated as missing" % self.non_finite)
        return notes


def main():
    parser = Parser(add_help=False)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--params", default="{}")
    try:
        args = parser.parse_args()
    except ArgError as err:
        die(2, "bad arguments: " + str(err))
    method, wanted = parse_params(args.params)
    try:
        size = os.path.getsize(args.input)
    except OSError as err:
        die(2, "cannot read the input: " + str(err))

    state = {"next": 5}

    def progress(fraction):
        percent = int(fraction * 90)
        if percent >= state["next"]:
            emit({"type": "progress", "percent": percent, "message": "reading input"})
            state["next"] = percent + 5

    emit({"type": "progress", "percent": 0, "message": "reading input"})
    try:
        # strict: text after a closing quote, or a quote left open at the end, is an error
        reader = csv.reader(lines(args.input, size, progress), strict=True)
        header = next((r for r in reader if r and r != [""]), None)  # blank lines are skipped
        if header is None:
            die(3, "the input is empty")
        header = [h.strip(WHITESPACE) for h in header]
        if any(h == "" for h in header):
            die(3, "the first line is not a CSV header")
        duplicates = sorted({h for h in header if header.count(h) > 1})
        if duplicates:
            die(3, "duplicate column name: " + ", ".join(duplicates))
        if wanted:
            missing = [c for c in wanted if c not in header]
            if missing:
                die(2, "no such columns: " + ", ".join(missing))
        columns = [Column(h, method == "median") for h in header]
        rows = 0
        is_number, is_non_finite, isfinite = NUMBER.match, NON_FINITE.match, math.isfinite
        for record in reader:
            if not record or record == [""]:
                continue
            if len(record) != len(header):
                die(3, "record %d: %d fields, the header has %d" % (rows + 2, len(record), len(header)))
            rows += 1
            for col, raw in zip(columns, record):
                if col.text:
                    continue  # a text column stays one: nothing more to count
                raw = raw.strip(WHITESPACE)
                if raw == "" or raw.upper() == "NA":
                    continue
                if is_number(raw):
                    x = float(raw)
                    if isfinite(x):
                        col.add(x)
                    else:
                        col.non_finite += 1
                elif is_non_finite(raw):
                    col.non_finite += 1
                else:
                    col.text += 1
    except csv.Error as err:
        die(3, "malformed CSV: " + str(err))
    except OSError as err:
        die(2, "cannot read the input: " + str(err))

    numeric = [c for c in columns if c.n > 0 and c.text == 0]
    chosen = [c for c in columns if c.name in wanted] if wanted else numeric
    if wanted:
        bad = [c.name for c in chosen if c not in numeric]
        if bad:
            die(3, "not numeric: " + ", ".join(bad))
    if not chosen:
        die(3, "no numeric column")

    emit({"type": "progress", "percent": 95, "message": "writing stats"})
    stats, notes = {}, {}
    for c in chosen:
        value = c.result(method)
        if c.notes(method, value):
            notes[c.name] = c.notes(method, value)
        stats[c.name] = value if value is None or math.isfinite(value) else None
    doc = {"method": method, "rows": rows, "columns": stats, "counts": {c.name: c.n for c in chosen}}
    if notes:
        doc["notes"] = notes
    with open(os.path.join(args.output_dir, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
    with open(os.path.join(args.output_dir, "stats.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["column", method])
        for name, value in stats.items():
            w.writerow([name, "" if value is None else value])
    emit({"type": "result", "outputFileName": "stats.json", "metrics": {"rows": rows, "columns": len(chosen)}})


if __name__ == "__main__":
    main()
