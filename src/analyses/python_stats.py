#!/usr/bin/env python3
"""python-stats: the chosen statistic (mean, median, stdev, min, max) of each numeric column of a CSV
(or of the given columns) -> stats.json and stats.csv. Standard library only; streams its input
(median keeps the column's values as packed doubles, 8 bytes each).
Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data."""
import argparse
import array
import codecs
import csv
import json
import math
import os
import statistics
import sys

METHODS = ("mean", "median", "stdev", "min", "max")


def emit(event):
    sys.stdout.write(json.dumps(event) + "\n")
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
    """Decoded lines of the file, reporting bytes read; refuses binary and non-UTF-8 input."""
    decoder = codecs.getincrementaldecoder("utf-8")()
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


class Column:
    def __init__(self, name, keep_values):
        self.name = name
        self.n = 0
        self.text = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.values = array.array("d") if keep_values else None

    def add(self, x):
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)
        self.min = min(self.min, x)
        self.max = max(self.max, x)
        if self.values is not None:
            self.values.append(x)

    def result(self, method):
        if method == "mean":
            return self.mean
        if method == "min":
            return self.min
        if method == "max":
            return self.max
        if method == "stdev":
            return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else None
        return statistics.median(self.values)


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
        reader = csv.reader(lines(args.input, size, progress))
        header = next(reader, None)
        if not header or any(h.strip() == "" for h in header):
            die(3, "the first line is not a CSV header")
        header = [h.strip() for h in header]
        if wanted:
            missing = [c for c in wanted if c not in header]
            if missing:
                die(2, "no such columns: " + ", ".join(missing))
        columns = [Column(h, method == "median") for h in header]
        rows = 0
        for record in reader:
            if not record:
                continue
            if len(record) != len(header):
                die(3, "line %d: %d fields, the header has %d" % (rows + 2, len(record), len(header)))
            rows += 1
            for col, raw in zip(columns, record):
                raw = raw.strip()
                if raw == "" or raw.upper() == "NA":
                    continue
                try:
                    x = float(raw)
                except ValueError:
                    col.text += 1
                    continue
                if math.isfinite(x):
                    col.add(x)
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
    stats = {c.name: c.result(method) for c in chosen}
    with open(os.path.join(args.output_dir, "stats.json"), "w") as f:
        json.dump({"method": method, "rows": rows, "columns": stats}, f, indent=2)
    with open(os.path.join(args.output_dir, "stats.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["column", method])
        for name, value in stats.items():
            w.writerow([name, "" if value is None else value])
    emit({"type": "result", "outputFileName": "stats.json", "metrics": {"rows": rows, "columns": len(chosen)}})


if __name__ == "__main__":
    main()
