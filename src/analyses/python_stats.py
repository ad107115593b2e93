#!/usr/bin/env python3
"""python-stats: the chosen statistic (mean, median, stdev, min, max) of each numeric column of a CSV
(or of the given columns) -> stats.json and stats.csv. Standard library only; streams its input
(median keeps the column's values as packed doubles, 8 bytes each).
Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.
CSV rules shared with summary.mjs and r_report.R (test/e2e/programs.test.ts has the table): UTF-8
only (a leading byte-order mark is dropped), RFC 4180 quoting, LF or CRLF line ends, blank lines
ignored, every record as long as the header; cells are trimmed of spaces, tabs, CR and LF; "" and NA
are missing; NaN/Inf/Infinity (any case, signed) and numbers beyond the double range are missing too
and counted in a note; a column is numeric when it has a number and no text. A statistic that is
not given is null (an empty cell in stats.csv), with a note in "notes" (by column) saying why: a double
cannot hold it ("<method> overflows"), or it is undefined ("stdev needs at least two values": the
stdev of a column with one value). -0 is written 0.0. In stats.csv a column name that a spreadsheet
would take for a formula gets a leading ' (as in the API's results.csv). The columns parameter names
header names as they are, or trimmed and in NFC as the header's names are.
stats.json and stats.csv must each fit in an output file (the runner's limit, OUTPUT_LIMITS in
src/runner/outputs.ts): a result that would be larger (too many columns, too long names) is exit 3.
Time is linear in the input, whatever its shape (a 200,000-digit cell, a 200,000-column header): no
regular expression here can backtrack more than once over a run of characters. Memory is bounded by
BLOCK, the longest field (about twice it) and the per-column state."""
import argparse
import array
import bisect
import codecs
import collections
import csv
import io
import json
import math
import os
import re
import struct
import sys
import unicodedata

METHODS = ("mean", "median", "stdev", "min", "max")
# Unambiguous: the digits before a dot can be split only one way (the old "[0-9]+\.?[0-9]*" could
# split a run of n digits n ways, so a long digit run that is not a number took O(n^2) to refuse).
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
# ASCII letters in any case only (as summary.mjs and r_report.R read them): Unicode IGNORECASE also took
# the Turkish dotless "ı" for an "i", so "ınf" was a NaN/Infinity here and text in the other two.
NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)\Z", re.IGNORECASE | re.ASCII)
WHITESPACE = " \t\r\n"
ERROR_CHARS = 500  # the most of a failure's message the runner keeps (MAX_MESSAGE_CHARS in jsonl.ts)
csv.field_size_limit(2**31 - 1)


# Output does not depend on the worker's locale (the runner passes LANG=C.UTF-8, but a program run by
# hand, or under a locale that is not UTF-8, may get another): stdout and stderr are UTF-8, and the
# arguments are read as the UTF-8 they were sent as (see utf8_arg).
for _stream in (sys.stdout, sys.stderr):
    _stream.reconfigure(encoding="utf-8", errors="backslashreplace")


def utf8_arg(value):
    """An argument as the UTF-8 the runner sent: Python decodes them in the locale's encoding, and in a
    Latin-1 locale the column "Straße" arrived as "StraÃ\x9fe", matching no header name."""
    return os.fsencode(value).decode("utf-8")


def emit(event):
    sys.stdout.write(json.dumps(event, allow_nan=False) + "\n")
    sys.stdout.flush()


def die(code, message):
    """Exit `code` (2 bad parameters, 3 unusable data), saying why: on stderr, and in an error event
    whose message (cut to ERROR_CHARS) the run's errorMessage shows to the user."""
    sys.stderr.write(message + "\n")
    try:
        emit({"type": "error", "message": message[:ERROR_CHARS]})
    except (OSError, ValueError):
        pass  # stdout is gone: the exit code still says it
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
    if columns is not None and not all(c.strip(WHITESPACE) for c in columns):
        die(2, "columns must be names, not blank")
    return method, columns


def column_key(name):
    """What a requested column is matched by when it is not a header name as it is: trimmed as the
    header's names are, in NFC (a name typed on one system and a header written on another can differ
    in the Unicode form of "é")."""
    return unicodedata.normalize("NFC", name.strip(WHITESPACE))


def find_columns(wanted, header):
    """The header names `wanted` asks for: each one as it is, or else the header name with its key.
    Exit 2 for a name that matches none, or whose key two header names share (they differ only in
    their Unicode form)."""
    names = set(header)
    by_key = collections.defaultdict(list)
    for h in header:
        by_key[column_key(h)].append(h)
    found, missing = set(), []
    for c in wanted:
        hits = [c] if c in names else by_key.get(column_key(c), [])
        if len(hits) > 1:
            die(2, "%s names more than one column: %s" % (c, ", ".join(hits)))
        if hits:
            found.add(hits[0])
        else:
            missing.append(c)
    if missing:
        die(2, "no such columns: " + ", ".join(missing))
    return found


TEXT_SHOWN = 40  # characters of a cell quoted in a message or in stats.json's notNumeric


def why_not_numeric(col):
    """Why a column is not numeric, for a message: its first text cell, or that it has no number."""
    if col.first_text:
        record, text = col.first_text
        return "record %d holds %s" % (record, json.dumps(text[:TEXT_SHOWN], ensure_ascii=False))
    return "no numbers in it" if col.non_finite == 0 else "only NaN/Infinity in it"


def guard_formula(text):
    """A name a spreadsheet would take for a formula (=, +, -, @, and tab or CR, which some programs
    skip before looking) gets a leading ', as results.csv's text cells do (src/tasks/results.ts), so
    opening stats.csv runs nothing. Numbers are written as numbers (-3.5 stays -3.5)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


MAX_OUTPUT_BYTES = 100 * 1024 * 1024  # the most an output file may be (OUTPUT_LIMITS.maxFileBytes)
BLOCK = 1 << 16  # bytes read, decoded and parsed at a time (progress at least every 5% of 1.3 MB)
SORT_RUN = 1 << 16  # values sorted at a time for the median


def utf16_without_mark(start):
    """UTF-16 without a byte-order mark, by its first bytes (up to 64): no zero in the low bytes (every
    other byte), and a zero in at least half of the high bytes, as text mostly of Latin letters is (as
    summary.mjs's utf16WithoutMark)."""
    n = min(len(start), 64) & ~1
    if n < 4:
        return False
    for high in (1, 0):
        if any(start[i] == 0 for i in range(1 - high, n, 2)):
            continue
        if 2 * sum(1 for i in range(high, n, 2) if start[i] == 0) >= n // 2:
            return True
    return False


def not_text(start):
    """What a file that is no UTF-8 text is, by its first bytes, for the message that refuses it."""
    if start[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return 'the input is UTF-16 text, not UTF-8: save it as UTF-8 ("CSV UTF-8")'
    if utf16_without_mark(start):
        return 'the input is UTF-16 text (without a byte-order mark), not UTF-8: save it as UTF-8 ("CSV UTF-8")'
    if start[:2] == b"\x1f\x8b":
        return "the input is gzip-compressed: decompress it first"
    if start[:4] == b"PK\x03\x04":
        return "the input is a zip archive (an Excel .xlsx workbook is one), not CSV: export it as CSV"
    return None


def separator_hint(header):
    """Why a file of one column may not be one: its header holds tabs or semicolons and no comma (a TSV,
    or a spreadsheet's export where the comma is the decimal mark). Said after an error such a file meets."""
    if len(header) != 1:
        return ""
    by = "tabs" if "\t" in header[0] else "semicolons" if ";" in header[0] else None
    return " (the header is split by %s, not commas: only comma-separated files are read)" % by if by else ""


def texts(path, size, progress):
    """The file's text, BLOCK bytes at a time (a character cut by a block's end is completed from the
    next); drops a leading byte-order mark; reports bytes read. A NUL byte (binary) or bytes that are not
    UTF-8 → exit 3, once the text before the line holding them is yielded: the order of errors of the
    line-by-line reading this replaces (a line of 50 MB was read whole: 400 MB)."""
    with open(path, "rb") as f:
        # The first bytes, as many as summary and r-report look at (utf16_without_mark: 64).
        data = f.read(64)
        why = not_text(data)
        if why:
            die(3, why)
        read = len(data)
        if data[:3] == codecs.BOM_UTF8:
            data = data[3:]
        while True:
            raw = f.read(BLOCK)
            read += len(raw)
            data += raw
            final = not raw
            nul = data.find(b"\x00")
            bad = None
            try:
                text, used = codecs.utf_8_decode(data if nul < 0 else data[:nul], "strict", False)
            except UnicodeDecodeError as err:
                bad = err.start
            if final and bad is None and nul < 0 and used < len(data):
                yield text  # a character cut off by the end of the file: the text before it is read first
                die(3, "the input is not UTF-8 text")
            if bad is not None or nul >= 0:
                if bad is None:
                    bad = nul
                line = data.rfind(b"\n", 0, bad) + 1
                if line > 0:
                    yield data[:line].decode("utf-8")
                binary = 0 <= nul and data.find(b"\n", line, nul) < 0  # a NUL in the bad line
                die(3, "the input is binary, not CSV" if binary else "the input is not UTF-8 text")
            data = data[used:]
            if not final:
                progress(read / max(size, 1))
            yield text
            if final:
                return


# The states of csv.reader (strict, the default dialect), which this parser replaces: csv.reader took
# its input line by line, and a field as long as its line cost 4 bytes a character more.
START_RECORD, START_FIELD, IN_FIELD, IN_QUOTED, QUOTE_IN_QUOTED, EAT_CRNL = range(6)
FIELD_END = re.compile(r"[,\r\n]")


def records(texts):
    """The records of the text pieces `texts`, as csv.reader(strict=True) read the file's lines split
    at LF (a quote opens a quoted field only as a field's first character; after a closing quote only a
    comma or a line end), except that a CR must be followed by LF: csv.reader skipped further CRs before
    it (CR CR LF), which summary.mjs and r_report.R refuse. A field is built from slices of the
    pieces, so pieces may end anywhere. Blank lines give [""] or nothing."""
    mode = START_RECORD
    fields = []
    parts = []  # the current field's text, in pieces
    field_end = FIELD_END.search
    for s in texts:
        i, n = 0, len(s)
        quote = cr = -1  # the next quote and CR at or after i (n: none), found when passed
        while i < n:
            if mode == START_RECORD:
                # a whole line without quotes or CRs: its fields are split at commas (the usual case)
                j = s.find("\n", i)
                if j >= 0:
                    if quote < i:
                        quote = s.find('"', i) % (n + 1)  # -1 → n
                    if cr < i:
                        cr = s.find("\r", i) % (n + 1)
                    if j < quote and j < cr:
                        yield s[i:j].split(",")
                        i = j + 1
                        continue
            if mode == IN_QUOTED:
                j = s.find('"', i)
                if j < 0:
                    parts.append(s[i:])
                    break
                parts.append(s[i:j])
                mode = QUOTE_IN_QUOTED
                i = j + 1
                continue
            c = s[i]
            if mode == START_RECORD:
                if c == "\n":  # a blank line
                    i += 1
                    continue
                if c == "\r":
                    mode = EAT_CRNL
                    i += 1
                    continue
                mode = START_FIELD
            if mode == START_FIELD:
                if c == '"':
                    mode = IN_QUOTED
                    i += 1
                    continue
                if c != "," and c != "\n" and c != "\r":
                    mode = IN_FIELD
                    continue
            elif mode == IN_FIELD:
                m = field_end(s, i)
                if m is None:
                    parts.append(s[i:])
                    break
                j = m.start()
                parts.append(s[i:j])
                i = j
                c = s[j]
            elif mode == QUOTE_IN_QUOTED:
                if c == '"':
                    parts.append('"')
                    mode = IN_QUOTED
                    i += 1
                    continue
                if c != "," and c != "\n" and c != "\r":
                    raise csv.Error("',' expected after '\"'")
            else:  # EAT_CRNL: the record was saved at its CR
                if c == "\n":
                    if fields:
                        yield fields
                    fields = []
                    mode = START_RECORD
                else:
                    # (csv.reader skipped further CRs here: "1,2\r\r\n", a CRLF file converted to CRLF
                    # again, which summary and r-report refuse)
                    raise csv.Error("a CR not followed by LF")
                i += 1
                continue
            # the end of a field (START_FIELD, IN_FIELD or QUOTE_IN_QUOTED at a comma, LF or CR)
            fields.append(parts[0] if len(parts) == 1 else "".join(parts))
            parts = []
            i += 1
            if c == ",":
                mode = START_FIELD
            elif c == "\n":
                yield fields
                fields = []
                mode = START_RECORD
            else:
                mode = EAT_CRNL
    # the end of the input ends the last line
    if mode == IN_QUOTED:
        raise csv.Error("unexpected end of data")
    if mode in (START_FIELD, IN_FIELD, QUOTE_IN_QUOTED):
        fields.append("".join(parts))
    if fields:
        yield fields


def _ordinal(x):
    """An integer in the order of the doubles (0.0 and -0.0 are both 0)."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits if bits >= 0 else -(bits & 0x7FFFFFFFFFFFFFFF)


def _from_ordinal(o):
    x = struct.unpack("<d", struct.pack("<q", abs(o)))[0]
    return x if o >= 0 else -x


def median(values, low, high):
    """The median of the array("d") `values` (its minimum and maximum given), exactly as from
    sorted(values) — equal values keep their order, which tells -0.0 from 0.0 — without a float object
    per value (sorted() of a whole column took ~52 bytes a value): runs of SORT_RUN values are sorted in
    place, then each middle value is found by bisection over the doubles' order, counting with bisect."""
    n = len(values)
    runs = []
    for start in range(0, n, SORT_RUN):
        end = min(start + SORT_RUN, n)
        values[start:end] = array.array("d", sorted(values[start:end]))
        runs.append((start, end))

    def count(find, x):
        return sum(find(values, x, start, end) - start for start, end in runs)

    def kth(k):  # the value at index k of sorted(values)
        lo, hi = _ordinal(low), _ordinal(high)
        while lo < hi:
            mid = (lo + hi) // 2
            if count(bisect.bisect_right, _from_ordinal(mid)) > k:
                hi = mid
            else:
                lo = mid + 1
        x = _from_ordinal(lo)
        if x != 0:
            return x
        # a zero: sorted() keeps the zeros (0.0 and -0.0) in their input order, as the runs do
        j = k - count(bisect.bisect_left, 0.0)
        for start, end in runs:
            first = bisect.bisect_left(values, 0.0, start, end)
            zeros = bisect.bisect_right(values, 0.0, start, end) - first
            if j < zeros:
                return values[first + j]
            j -= zeros
        raise AssertionError("median: the zeros were miscounted")

    half = n // 2
    if n % 2:
        return kth(half)
    a, b = kth(half - 1), kth(half)
    return (a + b) / 2 if math.isfinite(a + b) else a / 2 + b / 2


class Column:
    """Running statistics on values divided by `scale`, a power of two near the largest magnitude seen:
    the division is exact, and neither the sum nor Welford's sum of squares can overflow where the
    statistic itself is representable. The sum is compensated (Neumaier's variant of Kahan's
    summation): `compensation` gathers what each addition to `sum` rounded off (exactly: the error of a
    double addition is a double), so that sum + compensation is the sum as if added in twice the
    precision, then rounded (in plain doubles a mean of ten 0.1s was 0.09999999999999999). summary.mjs
    (addScaled) and r_report.R (compensated_sums) add in the same order, alike."""

    def __init__(self, name, keep_values):
        self.name = name
        self.n = 0
        self.text = 0
        self.first_text = None  # (record number, cell) of its first text cell: why it is not numeric
        self.non_finite = 0
        self.scale = 0.0
        self.sum = 0.0
        self.compensation = 0.0
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
                self.compensation *= f
                self.mean *= f
                self.m2 *= f * f
                self.scale = scale
        y = x / self.scale if self.scale else 0.0
        self.n += 1
        s = self.sum
        t = s + y
        self.compensation += (s - t) + y if abs(s) >= abs(y) else (y - t) + s
        self.sum = t
        delta = y - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (y - self.mean)
        self.min = min(self.min, x)
        self.max = max(self.max, x)
        if self.values is not None:
            self.values.append(x)

    def result(self, method):
        if method == "mean":
            # within [min, max] whatever the rounding (a constant column's mean is its value)
            return min(max((self.sum + self.compensation) / self.n * self.scale, self.min), self.max)
        if method == "min":
            return self.min
        if method == "max":
            return self.max
        if method == "stdev":
            return math.sqrt(self.m2 / (self.n - 1)) * self.scale if self.n > 1 else None
        return median(self.values, self.min, self.max)

    def notes(self, method, value):
        notes = []
        if value is None:  # undefined: only the stdev of a single value
            notes.append("%s needs at least two values" % method)
        elif not math.isfinite(value):
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
    try:
        raw_params = utf8_arg(args.params)
    except UnicodeDecodeError:
        die(2, "--params is not UTF-8")
    method, wanted = parse_params(raw_params)
    try:
        size = os.path.getsize(args.input)
    except OSError as err:
        die(2, "cannot read the input: " + (err.strerror or type(err).__name__))

    state = {"next": 5}

    def progress(fraction):
        percent = int(fraction * 90)
        if percent >= state["next"]:
            emit({"type": "progress", "percent": percent, "message": "reading input"})
            state["next"] = percent + 5

    emit({"type": "progress", "percent": 0, "message": "reading input"})
    try:
        # strict: text after a closing quote, or a quote left open at the end, is an error
        reader = records(texts(args.input, size, progress))
        header = next((r for r in reader if r and r != [""]), None)  # blank lines are skipped
        if header is None:
            die(3, "the input is empty")
        header = [h.strip(WHITESPACE) for h in header]
        if "" in header:
            die(3, "the first line is not a CSV header: its column %d has no name" % (header.index("") + 1))
        duplicates = sorted(h for h, k in collections.Counter(header).items() if k > 1)
        if duplicates:
            die(3, "duplicate column name: " + ", ".join(duplicates))
        wanted_names = find_columns(wanted, header) if wanted else set()
        columns = [Column(h, method == "median") for h in header]
        rows = 0
        is_number, is_non_finite, isfinite = NUMBER.match, NON_FINITE.match, math.isfinite
        for record in reader:
            if not record or record == [""]:
                continue
            if len(record) != len(header):
                die(
                    3,
                    "record %d: %d fields, the header has %d%s"
                    % (rows + 2, len(record), len(header), separator_hint(header)),
                )
            rows += 1
            for col, raw in zip(columns, record):
                if col.text:
                    continue  # a text column stays one: nothing more to count
                raw = raw.strip(WHITESPACE)
                if raw == "" or (len(raw) <= 2 and raw.upper() == "NA"):  # (upper() copies the cell)
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
                    col.first_text = (rows + 1, raw)
    except csv.Error as err:
        die(3, "malformed CSV: " + str(err))
    except OSError as err:
        die(2, "cannot read the input: " + (err.strerror or type(err).__name__))

    if rows == 0:
        die(3, "the input has a header and no rows")
    numeric = [c for c in columns if c.n > 0 and c.text == 0]
    chosen = [c for c in columns if c.name in wanted_names] if wanted else numeric
    if wanted:
        bad = [c for c in chosen if not (c.n > 0 and c.text == 0)]
        if bad:
            die(3, "not numeric: " + ", ".join(c.name + " (" + why_not_numeric(c) + ")" for c in bad))
    if not chosen:
        die(3, "no numeric column" + separator_hint(header))
    # The columns left out for a text cell, and the first such cell: until 2026-12-07 one "null" in a
    # column of a million numbers left it out of stats.json without a word.
    not_numeric = {c.name: {"record": c.first_text[0], "text": c.first_text[1][:TEXT_SHOWN]} for c in columns if c.first_text}

    emit({"type": "progress", "percent": 95, "message": "writing stats"})
    stats, notes = {}, {}
    for c in chosen:
        value = c.result(method)
        if c.notes(method, value):
            notes[c.name] = c.notes(method, value)
        # (+ 0.0: -0.0 is written 0.0, as summary and r-report write it)
        stats[c.name] = value + 0.0 if value is not None and math.isfinite(value) else None
    doc = {"method": method, "rows": rows, "columns": stats, "counts": {c.name: c.n for c in chosen}}
    if notes:
        doc["notes"] = notes
    if not_numeric and not wanted:
        doc["notNumeric"] = not_numeric
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["column", method])
    for name, value in stats.items():
        w.writerow([guard_formula(name), "" if value is None else value])
    outputs = {
        "stats.json": json.dumps(doc, indent=2, allow_nan=False).encode("utf-8"),
        "stats.csv": table.getvalue().encode("utf-8"),
    }
    for name, data in outputs.items():
        if len(data) > MAX_OUTPUT_BYTES:
            die(
                3,
                "%s would be at least %d MiB, more than the 100 MiB an output file may be: "
                "too many columns or too long column names" % (name, len(data) // (1024 * 1024)),
            )
    for name, data in outputs.items():
        try:
            with open(os.path.join(args.output_dir, name), "wb") as f:
                f.write(data)
        except OSError as e:
            # A full disk or a quota: the worker's to mend, so exit 4 (retried), not a crash (exit 1,
            # for good). The system's reason without the path.
            die(4, "could not write %s: %s" % (name, os.strerror(e.errno) if e.errno else "an error"))
    metrics = {"rows": rows, "columns": len(chosen)}
    if not_numeric and not wanted:
        metrics["notNumeric"] = len(not_numeric)
    emit({"type": "result", "outputFileName": "stats.json", "metrics": metrics})


if __name__ == "__main__":
    main()
