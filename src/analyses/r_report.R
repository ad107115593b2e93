#!/usr/bin/env Rscript
# r-report: an HTML report with a table of summary statistics per numeric column and small-multiple
# histograms of the numeric columns (at most MAX_PANELS), embedded as a PNG data URI -> report.html.
# Base R only.
# Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.
# CSV rules shared with summary.mjs and python_stats.py (test/e2e/programs.test.ts has the table):
# UTF-8 only (a leading byte-order mark is dropped), RFC 4180 quoting, LF or CRLF line ends, blank
# lines ignored, every record as long as the header; cells are trimmed of spaces, tabs, CR and LF;
# "" and NA are missing; NaN/Inf/Infinity (any case, signed) and numbers beyond the double range are
# missing too and counted in a note; a column is numeric when it has a number and no text. A statistic
# that is not given is a blank cell, with the reason in the row's notes: "<statistic> overflows" (a
# double cannot hold it) or "stdev needs at least two values" (a column with one value). -0 is written 0,
# and the mean is computed as summary and python-stats compute it.
# The input is read and parsed BLOCK bytes at a time (a record longer than that is carried over whole):
# memory is bounded by the block, the longest record and the numeric columns' values (8 bytes each, for
# the median and the histograms). Time is linear in the input: no regular expression here can backtrack
# more than once over a run of characters, whatever a cell holds (200,000 digits, 50,000 spaces), and
# nothing is done once per column per row.
# The report must fit in an output file (the runner's limit, OUTPUT_LIMITS in src/runner/outputs.ts): one
# that would be larger (too many numeric columns, too long names) is exit 3, found before the statistics.

# Nothing here may depend on the worker's locale (the runner passes LANG=C.UTF-8, but a program run
# by hand, or on a host without that locale, gets another): messages from R and the system (the reason
# a write failed, which the worker reads) in English, collation by code point; the rest is spelled out
# where it is used (no ignore.case: in a Turkish locale "I" is not the capital of "i"; lines written as
# UTF-8 bytes, never through the locale's encoding).
invisible(Sys.setlocale("LC_MESSAGES", "C"))
invisible(Sys.setlocale("LC_COLLATE", "C"))
Sys.setenv(LANGUAGE = "en")

MAX_PANELS <- 12L
BINS <- 20L
BLOCK <- 1048576
MAX_OUTPUT_BYTES <- 100 * 1048576 # the most an output file may be (OUTPUT_LIMITS.maxFileBytes)

json_str <- function(s) {
  s <- gsub("\\\\", "\\\\\\\\", s)
  s <- gsub("\"", "\\\\\"", s)
  s <- gsub("\n", "\\\\n", s)
  s <- gsub("\r", "\\\\r", s)
  s <- gsub("\t", "\\\\t", s)
  # Any other control character (a column name may hold one): as \u00XX, or the line is not JSON.
  for (cp in setdiff(1:31, c(9, 10, 13))) s <- gsub(intToUtf8(cp), sprintf("\\u%04x", cp), s, fixed = TRUE)
  paste0("\"", s, "\"")
}
# A line on `con` as UTF-8 bytes: cat() converts to the locale's encoding, which in a C locale wrote a
# column name "é" as "<U+00E9>" and in a Latin-1 one as a byte that is not UTF-8.
say <- function(line, con = stdout()) {
  writeLines(enc2utf8(line), con, useBytes = TRUE)
  flush(con)
}
emit_progress <- function(percent, message) {
  say(sprintf("{\"type\":\"progress\",\"percent\":%d,\"message\":%s}", as.integer(percent), json_str(message)))
}
# Exit `code` (2 bad parameters, 3 unusable data), saying why: on stderr, and in an error event whose
# message (cut to 500 characters, the most the runner keeps) the run's errorMessage shows to the user.
die <- function(code, message) {
  say(message, stderr())
  say(sprintf("{\"type\":\"error\",\"message\":%s}", json_str(substr(message, 1, 500))))
  quit(status = code, save = "no")
}
too_large <- function(bytes) {
  die(3, sprintf(
    paste(
      "report.html would be at least %.0f MiB, more than the 100 MiB an output file may be:",
      "too many numeric columns or too long column names"
    ),
    floor(bytes / 1048576)
  ))
}
html_escape <- function(s) {
  s <- gsub("&", "&amp;", s, fixed = TRUE)
  s <- gsub("<", "&lt;", s, fixed = TRUE)
  s <- gsub(">", "&gt;", s, fixed = TRUE)
  s <- gsub("\"", "&quot;", s, fixed = TRUE)
  gsub("'", "&#39;", s, fixed = TRUE)
}
base64 <- function(bytes) {
  chars <- c(LETTERS, letters, 0:9, "+", "/")
  pad <- (3 - length(bytes) %% 3) %% 3
  b <- as.integer(c(bytes, as.raw(rep(0L, pad))))
  m <- matrix(b, nrow = 3)
  v <- m[1, ] * 65536 + m[2, ] * 256 + m[3, ]
  idx <- rbind(v %/% 262144, (v %/% 4096) %% 64, (v %/% 64) %% 64, v %% 64)
  out <- chars[as.vector(idx) + 1]
  if (pad > 0) out[(length(out) - pad + 1):length(out)] <- "="
  paste(out, collapse = "")
}

# The body of a JSON string (between its quotes, already checked to be well formed) decoded in one
# pass: each escape is replaced by its character, so "\\n" stays a backslash and an n.
json_unescape <- function(s) {
  re <- "\\\\u[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\\\u[0-9a-fA-F]{4}|\\\\[\"\\\\/bfnrt]"
  m <- gregexpr(re, s, perl = TRUE)
  escapes <- regmatches(s, m)[[1]]
  if (length(escapes) == 0) return(s)
  simple <- c("\"" = "\"", "\\" = "\\", "/" = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t")
  decoded <- vapply(escapes, function(e) {
    if (substr(e, 2, 2) != "u") return(simple[[substr(e, 2, 2)]])
    units <- strtoi(regmatches(e, gregexpr("[0-9a-fA-F]{4}", e))[[1]], 16L)
    cp <- if (length(units) == 2) 65536 + (units[1] - 55296) * 1024 + (units[2] - 56320) else units
    if (cp == 0 || (cp >= 55296 && cp <= 57343)) die(2, "title must not contain NUL or a lone surrogate")
    intToUtf8(cp)
  }, character(1), USE.NAMES = FALSE)
  regmatches(s, m) <- list(decoded)
  s
}

# The only parameter is an optional title: {} or {"title": "..."}; anything else is exit 2.
parse_params <- function(raw) {
  if (!validUTF8(raw)) die(2, "--params is not UTF-8")
  Encoding(raw) <- "UTF-8"
  raw <- trimws(raw)
  if (grepl("^\\{\\s*\\}$", raw, perl = TRUE)) return(list(title = NULL))
  re <- "^\\{\\s*\"title\"\\s*:\\s*\"((?:[^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4})*)\"\\s*\\}$"
  if (!grepl(re, raw, perl = TRUE)) die(2, "parameters must be {} or {\"title\": \"...\"}")
  s <- json_unescape(regmatches(raw, regexec(re, raw, perl = TRUE))[[1]][2])
  if (nchar(s) == 0 || nchar(s) > 200) die(2, "title must be 1-200 characters")
  list(title = s)
}

# Fields of CSV text (marked "bytes") that starts at a record's start: one anchored regular expression
# matches a field and its terminator at a time; the first byte it cannot match is an error. Unless
# `final`, only whole records are taken — up to the last field that ends in a line end — and a quoted
# field still open at the end of the text is not an error: its record goes on in the next block.
# `used`: the bytes taken (0 when the text holds no whole record yet); `need`: a byte that can finish
# the record left over, a quote when it ends in an open quoted field, else LF.
FIELD_RE <- "\\G(?:\"((?:[^\"]++|\"\")*+)\"|([^,\"\r\n][^,\r\n]*+|))(,|\r?\n|\r?\\z)"
OPEN_QUOTED_RE <- "^\"(?:[^\"]++|\"\")*+\\z"
LF <- as.raw(10)
QUOTE <- as.raw(0x22)
parse_csv <- function(text, final, offset) {
  total <- nchar(text, type = "bytes")
  m <- gregexpr(FIELD_RE, text, perl = TRUE, useBytes = TRUE)[[1]]
  n <- if (m[1] == 1) length(m) else 0L
  end <- if (n > 0) m[n] + attr(m, "match.length")[n] - 1 else 0
  open <- FALSE
  if (end < total) {
    open <- !final && substr(text, end + 1, end + 1) == "\"" &&
      grepl(OPEN_QUOTED_RE, substring(text, end + 1, total), perl = TRUE, useBytes = TRUE)
    if (!open && end == 0) die(3, sprintf("malformed CSV at byte %.0f", offset + 1))
    if (!open) {
      die(3, sprintf("malformed CSV at byte %.0f (a quote opened or closed mid-field, or a bare CR)", offset + end + 1))
    }
  }
  need <- if (open) QUOTE else LF
  if (n == 0) return(list(used = 0, need = need))
  cs <- attr(m, "capture.start")
  cl <- attr(m, "capture.length")
  terminator <- substring(text, cs[, 3], cs[, 3] + cl[, 3] - 1)
  k <- n
  if (!final) {
    newline <- terminator == "\n" | terminator == "\r\n"
    if (!any(newline)) return(list(used = 0, need = need))
    k <- max(which(newline))
  }
  keep <- seq_len(k)
  quoted <- cs[keep, 1] > 0
  start <- ifelse(quoted, cs[keep, 1], cs[keep, 2])
  len <- ifelse(quoted, cl[keep, 1], cl[keep, 2])
  values <- substring(text, start, start + len - 1)
  values[quoted] <- gsub("\"\"", "\"", values[quoted], fixed = TRUE)
  # every byte that is not a separator is in a value: the text is UTF-8 when every value is
  if (!all(validUTF8(values))) die(3, "the input is not UTF-8 text")
  Encoding(values) <- "UTF-8"
  ends <- terminator[keep] != ","
  if (!ends[k]) { # "1,2," at the very end: the record ends with an empty field
    values <- c(values, "")
    ends <- c(ends, TRUE)
  }
  used <- if (final) total else m[k] + attr(m, "match.length")[k] - 1
  list(used = used, need = need, values = values, ends = ends)
}

# Spaces, tabs, CR and LF off both ends (as trimws(x, whitespace = "[ \t\r\n]"), whose "[ \t\r\n]+$"
# was retried at every space of a run inside a cell: O(n^2) on 50,000 spaces). The trailing run is
# matched only where it starts, after the last other character, so each run is scanned once.
trim <- function(x) {
  edge <- grepl("^[ \t\r\n]|[ \t\r\n]$", x, perl = TRUE)
  if (any(edge)) {
    y <- sub("^[ \t\r\n]+", "", x[edge], perl = TRUE)
    x[edge] <- sub("(?<=[^ \t\r\n])[ \t\r\n]++$", "", y, perl = TRUE)
  }
  x
}

# The percentage of x's values in each of BINS equal bins between its minimum and maximum.
histogram_percents <- function(x) {
  s <- scale_of(x)
  lo <- min(x) / s
  span <- max(x) / s - lo
  u <- if (span > 0) (x / s - lo) / span else rep(0.5, length(x))
  bin <- pmin(floor(u * BINS), BINS - 1L) + 1L
  100 * tabulate(bin, nbins = BINS) / length(x)
}

# A power of two near the largest magnitude: x / scale is exact and of order 1, so sums and squares of
# scaled values cannot overflow where the statistic itself is representable. Vectorised: m holds the
# largest magnitude of each column.
scale_of <- function(x) powers_of_two(max(abs(x)))
powers_of_two <- function(m) ifelse(m == 0, 1, 2^pmin(pmax(floor(log2(m)), -1074), 1023))

# The sum of each group of y (its values one after another, n of each, in file order), compensated as
# summary.mjs (addScaled) and python_stats.py (Column.add) compensate theirs, in the same order and so
# to the same bit: Neumaier's variant of Kahan's summation, where what each addition of a value to the
# running sum s rounds off (exactly: the error of a double addition is a double) is gathered in a
# second sum, added to s at the end. R has no loop fast per value: the running sums in doubles of a
# long group are stats::filter's recursive filter (cumsum and sum() add in long double), SUM_CHUNK
# values at a time, each error follows from them in one vector operation, and so does their running sum;
# the short groups are added side by side, one value of each per step (a filter call per group made a
# million narrow columns slow).
LONG_GROUP <- 512L
SUM_CHUNK <- 262144L
running_sums <- function(v, init) as.vector(stats::filter(v, 1, method = "recursive", init = init))
rounded_off <- function(s, v, t) { # t = s + v: (s - t) + v, or (v - t) + s where |s| < |v|
  swap <- abs(s) < abs(v)
  big <- s
  big[swap] <- v[swap]
  small <- v
  small[swap] <- s[swap]
  (big - t) + small
}
compensated_sums <- function(y, n) {
  end <- cumsum(as.numeric(n))
  start <- end - n + 1
  total <- numeric(length(n))
  for (k in which(n > LONG_GROUP)) {
    s <- 0
    lost <- 0
    for (from in seq(start[k], end[k], by = SUM_CHUNK)) {
      v <- y[from:min(from + SUM_CHUNK - 1, end[k])]
      t <- running_sums(v, s)
      lost <- running_sums(rounded_off(c(s, t[-length(t)]), v, t), lost)[length(t)]
      s <- t[length(t)]
    }
    total[k] <- s + lost
  }
  short <- which(n <= LONG_GROUP)
  short <- short[order(n[short], decreasing = TRUE)] # the groups still adding: a prefix of short
  if (length(short) > 0) {
    alive <- rev(cumsum(rev(tabulate(n[short], n[short[1]])))) # at step i, the groups of n >= i
    s <- numeric(length(short))
    lost <- numeric(length(short))
    for (i in seq_along(alive)) {
      k <- seq_len(alive[i])
      v <- y[start[short[k]] + (i - 1)]
      t <- s[k] + v
      lost[k] <- lost[k] + rounded_off(s[k], v, t)
      s[k] <- t
    }
    total[short] <- s + lost
  }
  total
}

args <- commandArgs(trailingOnly = TRUE)
opt <- list()
i <- 1
while (i <= length(args)) {
  key <- args[i]
  if (!(key %in% c("--input", "--output-dir", "--params")) || i == length(args)) die(2, paste("bad argument:", key))
  opt[[substring(key, 3)]] <- args[i + 1]
  i <- i + 2
}
if (is.null(opt[["input"]]) || is.null(opt[["output-dir"]])) die(2, "--input and --output-dir are required")
params <- parse_params(if (is.null(opt[["params"]])) "{}" else opt[["params"]])

# What a file that is no UTF-8 text is, by its first bytes, for the message that refuses it (NULL: none
# of these).
# UTF-16 without a byte-order mark, by its first bytes (up to 64): no zero in the low bytes (every other
# byte), and a zero in at least half of the high bytes, as text mostly of Latin letters is (as
# summary.mjs's utf16WithoutMark).
utf16_without_mark <- function(start) {
  n <- min(length(start), 64L) %/% 2L * 2L
  if (n < 4L) return(FALSE)
  zero <- start[seq_len(n)] == as.raw(0)
  second <- seq_len(n) %% 2L == 0L # offsets 1, 3, …
  for (high in list(second, !second)) {
    if (!any(zero[!high]) && 2 * sum(zero[high]) >= n %/% 2L) return(TRUE)
  }
  FALSE
}
not_text <- function(start) {
  b <- as.integer(start[seq_len(min(4L, length(start)))])
  if (length(b) >= 2 && ((b[1] == 0xff && b[2] == 0xfe) || (b[1] == 0xfe && b[2] == 0xff))) {
    return("the input is UTF-16 text, not UTF-8: save it as UTF-8 (\"CSV UTF-8\")")
  }
  if (utf16_without_mark(start)) {
    return("the input is UTF-16 text (without a byte-order mark), not UTF-8: save it as UTF-8 (\"CSV UTF-8\")")
  }
  if (length(b) >= 2 && b[1] == 0x1f && b[2] == 0x8b) return("the input is gzip-compressed: decompress it first")
  if (length(b) >= 4 && all(b == c(0x50, 0x4b, 0x03, 0x04))) {
    return("the input is a zip archive (an Excel .xlsx workbook is one), not CSV: export it as CSV")
  }
  NULL
}
# Why a file of one column may not be one: its header holds tabs or semicolons and no comma (a TSV, or a
# spreadsheet's export where the comma is the decimal mark). Said after an error such a file meets.
separator_hint <- function(header) {
  if (length(header) != 1) return("")
  by <- if (grepl("\t", header, fixed = TRUE)) "tabs" else if (grepl(";", header, fixed = TRUE)) "semicolons" else ""
  if (by == "") "" else sprintf(" (the header is split by %s, not commas: only comma-separated files are read)", by)
}
emit_progress(0, "reading input")
size <- file.size(opt[["input"]])
if (is.na(size)) die(2, "cannot read the input")
# Unambiguous: the digits before a dot can be split only one way (the old "[0-9]+\.?[0-9]*" could
# split a run of n digits n ways: O(n^2) to refuse a long digit run that is not a number).
NUMBER <- "^[+-]?(?:[0-9]+(?:\\.[0-9]*)?|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
# Any case, spelled out: ignore.case follows the locale's letters (in tr_TR "INF" and "Infinity" did
# not match, and a column holding them was text).
NON_FINITE <- "^[+-]?(?:[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)$"
# Per column, from the header on: text cells (a column with one is not numeric, and is not looked at
# again), NaN/Infinity cells, and the finite numbers, as a list of vectors in row order.
header <- NULL
text_count <- integer(0)
non_finite <- integer(0)
values_of <- list()
pending_x <- list() # numbers not yet filed by column, and their columns
pending_col <- list()
pending_n <- 0
nrows <- 0L
con <- file(opt[["input"]], "rb")
carry <- raw(0) # the start of a record not finished yet
waiting <- list() # blocks read after it, not parsed yet
waiting_bytes <- 0
need <- LF # a byte that can finish that record (see parse_csv)
need_seen <- FALSE
offset <- 0 # bytes parsed (after a byte-order mark)
read <- 0
next_progress <- 5
repeat {
  chunk <- readBin(con, what = "raw", n = BLOCK)
  final <- length(chunk) == 0
  if (!final) {
    first <- read == 0
    if (first) {
      why <- not_text(chunk)
      if (!is.null(why)) die(3, why)
    }
    if (any(chunk == as.raw(0))) die(3, "the input is binary, not CSV")
    read <- read + length(chunk)
    if (first && length(chunk) >= 3 && identical(chunk[1:3], as.raw(c(0xef, 0xbb, 0xbf)))) chunk <- chunk[-(1:3)]
    waiting[[length(waiting) + 1L]] <- chunk
    waiting_bytes <- waiting_bytes + length(chunk)
    need_seen <- need_seen || any(chunk == need)
    rm(chunk)
    percent <- floor(read / max(size, 1) * 55)
    if (percent >= next_progress) {
      emit_progress(percent, "reading input")
      next_progress <- percent + 5
    }
    # Parsed when the blocks can finish the record carried over; a long record only each time it has
    # grown by a quarter, so that it is parsed O(log n) times, not once per block.
    if (!need_seen || waiting_bytes < length(carry) / 4) next
  }
  bytes <- do.call(c, c(list(carry), waiting))
  carry <- raw(0)
  waiting <- list()
  waiting_bytes <- 0
  need_seen <- FALSE
  used <- 0
  if (length(bytes) > 0) {
    text <- rawToChar(bytes)
    rm(bytes)
    Encoding(text) <- "bytes"
    parsed <- parse_csv(text, final, offset)
    used <- parsed$used
    need <- parsed$need
    total <- nchar(text, type = "bytes")
    carry <- if (used < total) charToRaw(substring(text, used + 1, total)) else raw(0)
    rm(text)
    offset <- offset + used
  }
  if (used > 0) {
    values <- parsed$values
    ends <- parsed$ends
    rm(parsed)
    record <- cumsum(c(1L, head(ends, -1)))
    nrec <- record[length(record)]
    fields_per_record <- tabulate(record, nbins = nrec)
    body <- !(fields_per_record == 1 & values[cumsum(fields_per_record)] == "") # not blank
    if (is.null(header) && any(body)) {
      h <- which(body)[1]
      header <- trim(values[record == h])
      if (any(header == "")) {
        die(3, sprintf("the first line is not a CSV header: its column %d has no name", which(header == "")[1]))
      }
      if (anyDuplicated(header)) die(3, paste("duplicate column name:", header[anyDuplicated(header)]))
      ncol <- length(header)
      text_count <- integer(ncol)
      non_finite <- integer(ncol)
      values_of <- rep(list(list()), ncol)
      value_count <- integer(ncol) # the numbers filed in values_of, by column
      # Each column's first text cell (why it is not numeric): its record number, as python-stats
      # counts them (the header is record 1, blank lines not counted), and its text.
      first_text_record <- integer(ncol)
      first_text <- character(ncol)
      body[h] <- FALSE
    }
    if (any(body)) {
      short_or_long <- which(body & fields_per_record != ncol)
      if (length(short_or_long) > 0) {
        r <- short_or_long[1]
        # Numbered as summary and python-stats number it: the header is 1, blank lines not counted
        # (until 2026-12-07 they were counted here).
        die(3, sprintf(
          "record %.0f: %d fields, the header has %d%s",
          nrows + cumsum(body)[r] + 1, fields_per_record[r], ncol, separator_hint(header)
        ))
      }
      in_body <- body[record]
      cell_record <- nrows + 1L + cumsum(body)[record[in_body]] # each body cell's record number
      nrows <- nrows + sum(body)
      v <- values[in_body] # the body's cells, row by row
      col <- rep_len(seq_len(ncol), length(v))
      live <- text_count[col] == 0
      v <- trim(v[live])
      col <- col[live]
      cell_record <- cell_record[live]
      missing <- v == ""
      two <- nchar(v) == 2L # only 2 characters can be "NA" in any case (and no copy of a long cell)
      missing[two] <- v[two] %in% c("NA", "Na", "nA", "na")
      number <- grepl(NUMBER, v, perl = TRUE)
      non_finite_text <- grepl(NON_FINITE, v, perl = TRUE)
      x <- as.numeric(v[number])
      x_col <- col[number]
      finite <- is.finite(x)
      is_text <- !missing & !number & !non_finite_text
      if (any(is_text)) {
        # Only columns without text so far are live: each one's first text cell here is its first.
        text_col <- col[is_text]
        first <- !duplicated(text_col)
        first_text_record[text_col[first]] <- cell_record[is_text][first]
        first_text[text_col[first]] <- v[is_text][first]
        rm(text_col, first)
      }
      text_count <- text_count + tabulate(col[is_text], ncol)
      non_finite <- non_finite + tabulate(col[non_finite_text], ncol) + tabulate(x_col[!finite], ncol)
      if (any(finite)) {
        pending_x[[length(pending_x) + 1L]] <- x[finite]
        pending_col[[length(pending_col) + 1L]] <- x_col[finite]
        pending_n <- pending_n + sum(finite)
      }
      rm(v, col, live, missing, number, non_finite_text, is_text, x, x_col, finite, in_body, cell_record)
    }
    rm(values, ends, record, fields_per_record, body)
  }
  # File the pending numbers by column now and then (at least 16 a column on average): not once per
  # column per block, which a file of wide rows would make slow.
  if (pending_n > 0 && (final || pending_n >= max(BLOCK, 16 * length(header)))) {
    x <- unlist(pending_x, use.names = FALSE)
    x_col <- unlist(pending_col, use.names = FALSE)
    pending_x <- list()
    pending_col <- list()
    pending_n <- 0
    live <- text_count[x_col] == 0
    by_col <- split(x[live], x_col[live])
    cols <- as.integer(names(by_col))
    for (k in seq_along(by_col)) values_of[[cols[k]]][[length(values_of[[cols[k]]]) + 1L]] <- by_col[[k]]
    value_count <- value_count + tabulate(x_col[live], length(header))
    dead <- text_count > 0 & lengths(values_of) > 0
    if (any(dead)) values_of[dead] <- list(list())
    rm(x, x_col, live, by_col, cols)
  }
  if (final) break
}
close(con)
if (is.null(header)) die(3, "the input is empty")
if (nrows == 0) die(3, "the input has a header and no rows")
numeric_cols <- which(text_count == 0 & lengths(values_of) > 0)
if (length(numeric_cols) == 0) die(3, paste0("no numeric column", separator_hint(header)))
numeric_names <- header[numeric_cols]

emit_progress(60, "computing statistics")
# The table's figures: the mean and the stdev, computed, to 6 significant digits; the min, median and
# max in full, with as few of 15, 16 or 17 significant digits as read back as the same double (as
# summary and python-stats write them; %g drops trailing zeros, so 0.1 is "0.1"): a max of 999.9996 to
# 6 digits was "1000", a value the column does not have. -0 is written 0, as the other two write it
# (v + 0 is 0 for -0). Vectorised, unlike format(), which took most of ~250 µs a column.
fmt <- function(v) {
  s <- sprintf("%.6g", v + 0)
  s[!is.finite(v)] <- ""
  s
}
exact <- function(v) {
  v <- v + 0
  s <- sprintf("%.15g", v)
  for (d in 16:17) {
    redo <- which(is.finite(v) & as.numeric(s) != v)
    if (length(redo) == 0) break
    s[redo] <- sprintf(paste0("%.", d, "g"), v[redo])
  }
  s[!is.finite(v)] <- ""
  s
}
rows <- character(length(numeric_cols))
escaped_names <- html_escape(numeric_names)
plotted <- head(seq_along(numeric_cols), MAX_PANELS)
# What the report takes at least: a table row of 85 bytes besides the name for each numeric column, and
# the name again under the histograms (twice when plotted: the list and the image's alt text).
name_bytes <- as.numeric(nchar(escaped_names, type = "bytes"))
at_least <- 85 * length(numeric_cols) + 2 * sum(name_bytes) + sum(name_bytes[plotted])
if (at_least > MAX_OUTPUT_BYTES) too_large(at_least)
percents <- vector("list", length(plotted))
ranges <- vector("list", length(plotted))
# A batch of columns at a time (one column, or as many as hold up to BATCH values): their values as one
# vector in file order with each value's column, and an order that sorts it by column, then value. Each
# figure of every column in the batch is then one vector operation (a loop over the columns made a
# million narrow columns take minutes). The mean is the compensated sum of the scaled values in file
# order (compensated_sums) divided by their count, within the column's minimum and maximum, as summary
# and python-stats compute it; the stdev takes a second pass around it (around a mean rounded off, a
# constant column's stdev was 1.46285e-17).
BATCH <- 65536
counts <- value_count[numeric_cols]
before <- cumsum(as.numeric(counts)) - counts # values in the columns before each
first <- 1L
while (first <= length(numeric_cols)) {
  last <- max(first, findInterval(before[first] + BATCH, before + counts))
  b <- first:last
  n <- counts[b]
  x <- unlist(values_of[numeric_cols[b]], use.names = FALSE)
  values_of[numeric_cols[b]] <- list(NULL)
  g <- rep.int(seq_along(b), n)
  o <- order(g, x, method = "radix")
  end <- cumsum(n)
  start <- end - n + 1L
  lo <- x[o[start]]
  hi <- x[o[end]]
  m1 <- x[o[start + (n - 1L) %/% 2L]] # the middle value, or the two middle values
  m2 <- x[o[start + n %/% 2L]]
  median <- ifelse(is.finite(m1 + m2), (m1 + m2) / 2, m1 / 2 + m2 / 2)
  for (k in intersect(b, plotted)) {
    i <- k - first + 1L
    percents[[k]] <- histogram_percents(x[o[start[i]:end[i]]])
    ranges[[k]] <- c(lo[i], hi[i])
  }
  rm(o)
  s <- powers_of_two(pmax(abs(lo), abs(hi)))
  y <- x / s[g]
  rm(x)
  scaled_mean <- pmin(pmax(compensated_sums(y, n) / n, lo / s), hi / s)
  mean <- scaled_mean * s
  stdev <- sqrt(as.vector(rowsum((y - scaled_mean[g])^2, g)) / (n - 1)) * s
  stdev[n < 2] <- NA
  rm(y, g)
  nf <- non_finite[numeric_cols[b]]
  # (min, median and max are values of the column, or halfway between two: they cannot overflow)
  notes <- paste0(
    ifelse(is.finite(mean), "", "mean overflows; "),
    ifelse(is.na(stdev) | is.finite(stdev), "", "stdev overflows; "),
    ifelse(n < 2, "stdev needs at least two values; ", ""),
    ifelse(nf > 0, sprintf("%d NaN/Infinity values treated as missing; ", nf), "")
  )
  rows[b] <- sprintf(
    "<tr><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
    escaped_names[b], n, fmt(mean), fmt(stdev), exact(lo), exact(median), exact(hi),
    html_escape(sub("; $", "", notes))
  )
  first <- last + 1L
}

# Small multiples: one panel per numeric column, each binned in BINS equal bins between the column's
# own minimum and maximum (printed under the panel), all on one vertical scale: the percentage of
# the column's values in a bin, from 0 to the tallest bar of any panel.
emit_progress(80, "drawing histograms")
left_out <- numeric_names[-plotted]
ymax <- max(unlist(percents))
panel_cols <- min(length(plotted), 3L)
panel_rows <- ceiling(length(plotted) / panel_cols)
png_file <- tempfile(fileext = ".png")
png(png_file, width = 320 * panel_cols, height = 240 * panel_rows, type = "cairo")
par(mfrow = c(panel_rows, panel_cols), mar = c(3, 4, 2, 1), mgp = c(2, 0.6, 0))
for (k in plotted) {
  plot.new()
  plot.window(xlim = c(0, 1), ylim = c(0, ymax))
  edges <- seq(0, 1, length.out = BINS + 1)
  rect(edges[-(BINS + 1)], 0, edges[-1], percents[[k]], col = "grey70", border = "white")
  # The minimum and maximum under the panel's ends, each aligned inwards: centred on the ends, a long
  # one ("3.912e+200") ran into the next panel or, in the last column, off the image ("3.912e+20").
  axis(1, at = c(0, 1), labels = FALSE)
  mtext(format(ranges[[k]][1], digits = 4), side = 1, line = 0.6, at = 0, adj = 0, cex = 0.8)
  mtext(format(ranges[[k]][2], digits = 4), side = 1, line = 0.6, at = 1, adj = 1, cex = 0.8)
  axis(2, las = 1)
  title(main = numeric_names[k], ylab = "% of values")
}
invisible(dev.off())
png_bytes <- readBin(png_file, what = "raw", n = file.size(png_file))
unlink(png_file)

MAX_NOT_NUMERIC_SHOWN <- 100L # columns named in the report's "Not numeric" line; the rest counted
title <- if (is.null(params$title)) "Analysis report" else params$title
plotted_names <- html_escape(numeric_names[seq_along(plotted)])
html <- c(
  "<!DOCTYPE html>",
  "<html><head><meta charset=\"utf-8\">",
  sprintf("<title>%s</title>", html_escape(title)),
  "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>",
  "</head><body>",
  sprintf("<h1>%s</h1>", html_escape(title)),
  sprintf("<p>%d rows, %d columns, %d numeric.</p>", nrows, length(header), length(numeric_cols)),
  # The columns left out for a text cell, and the first such cell: until 2026-12-07 the report said
  # only how many were numeric.
  if (any(first_text_record > 0)) {
    k <- which(first_text_record > 0)
    more <- length(k) - MAX_NOT_NUMERIC_SHOWN
    k <- head(k, MAX_NOT_NUMERIC_SHOWN)
    sprintf(
      "<p class=\"not-numeric\">Not numeric (a text cell leaves a column out): %s%s.</p>",
      paste(
        sprintf(
          "%s (record %d holds \u201c%s\u201d)",
          html_escape(header[k]), first_text_record[k], html_escape(substr(first_text[k], 1L, 40L))
        ),
        collapse = "; "
      ),
      if (more > 0) sprintf("; and %d more", more) else ""
    )
  },
  "<table><thead><tr><th>column</th><th>n</th><th>mean</th><th>stdev</th><th>min</th><th>median</th><th>max</th><th>notes</th></tr></thead><tbody>",
  rows,
  "</tbody></table>",
  "<p class=\"digits\">Mean and stdev to 6 significant digits; min, median and max in full. A blank cell is a statistic the notes explain.</p>",
  "<h2>Histograms</h2>",
  sprintf(
    "<p class=\"scale\">One panel per numeric column, each in %d equal bins between the column's own minimum and maximum (printed under the panel); the vertical axis is shared by all panels: the percentage of the column's values in each bin.</p>",
    BINS
  ),
  sprintf("<p class=\"plotted\">Plotted: %s.</p>", paste(plotted_names, collapse = ", ")),
  if (length(left_out) > 0) {
    sprintf(
      "<p class=\"not-plotted\">Not plotted (at most %d panels): %s.</p>",
      MAX_PANELS, paste(html_escape(left_out), collapse = ", ")
    )
  },
  sprintf(
    "<img alt=\"histograms of %s\" src=\"data:image/png;base64,%s\">",
    paste(plotted_names, collapse = ", "), base64(png_bytes)
  ),
  "</body></html>"
)
html_bytes <- sum(as.numeric(nchar(html, type = "bytes"))) + length(html) # and a newline each
if (html_bytes > MAX_OUTPUT_BYTES) too_large(html_bytes)
# A full disk or a quota: writeLines only warns (the connection could not be closed) and the report is
# cut short. Exit 4 (retried: the worker's to mend), with the system's reason and not the path; a
# report shorter than what was written, however it came about, likewise.
report_path <- file.path(opt[["output-dir"]], "report.html")
write_failed <- function(condition) {
  die(4, paste("could not write report.html:", sub(".*: ", "", conditionMessage(condition))))
}
tryCatch(writeLines(html, report_path, useBytes = TRUE), warning = write_failed, error = write_failed)
if (!isTRUE(file.size(report_path) == html_bytes)) {
  die(4, "could not write report.html: it is shorter than what was written")
}
emit_progress(95, "report written")
say(sprintf(
  "{\"type\":\"result\",\"outputFileName\":\"report.html\",\"metrics\":{\"rows\":%d,\"numericColumns\":%d%s}}",
  nrows, length(numeric_cols),
  if (any(first_text_record > 0)) sprintf(",\"notNumeric\":%d", sum(first_text_record > 0)) else ""
))
