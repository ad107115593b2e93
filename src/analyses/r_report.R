#!/usr/bin/env Rscript
# r-report: an HTML report with a table of summary statistics per numeric column and small-multiple
# histograms of the numeric columns (at most MAX_PANELS), embedded as a PNG data URI -> report.html.
# Base R only.
# Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.
# CSV rules shared with summary.mjs and python_stats.py (test/e2e/programs.test.ts has the table):
# UTF-8 only (a leading byte-order mark is dropped), RFC 4180 quoting, LF or CRLF line ends, blank
# lines ignored, every record as long as the header; cells are trimmed of spaces, tabs, CR and LF;
# "" and NA are missing; NaN/Inf/Infinity (any case, signed) and numbers beyond the double range are
# missing too and counted in a note; a column is numeric when it has a number and no text.

MAX_PANELS <- 12L
BINS <- 20L

json_str <- function(s) {
  s <- gsub("\\\\", "\\\\\\\\", s)
  s <- gsub("\"", "\\\\\"", s)
  s <- gsub("\n", "\\\\n", s)
  s <- gsub("\r", "\\\\r", s)
  s <- gsub("\t", "\\\\t", s)
  paste0("\"", s, "\"")
}
emit_progress <- function(percent, message) {
  cat(sprintf("{\"type\":\"progress\",\"percent\":%d,\"message\":%s}\n", as.integer(percent), json_str(message)))
  flush(stdout())
}
die <- function(code, message) {
  cat(message, "\n", file = stderr())
  quit(status = code, save = "no")
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

# Fields and record boundaries of a whole CSV text (marked "bytes"): one anchored regular expression
# matches a field and its terminator at a time; the first byte it cannot match is an error.
parse_csv <- function(text) {
  re <- "\\G(?:\"((?:[^\"]++|\"\")*+)\"|([^,\"\r\n][^,\r\n]*+|))(,|\r?\n|\r?\\z)"
  m <- gregexpr(re, text, perl = TRUE, useBytes = TRUE)[[1]]
  total <- nchar(text, type = "bytes")
  if (m[1] != 1) die(3, "malformed CSV at byte 1")
  n <- length(m)
  end <- m[n] + attr(m, "match.length")[n] - 1
  if (end < total) die(3, sprintf("malformed CSV at byte %d (a quote opened or closed mid-field, or a bare CR)", end + 1))
  cs <- attr(m, "capture.start")
  cl <- attr(m, "capture.length")
  quoted <- cs[, 1] > 0
  start <- ifelse(quoted, cs[, 1], cs[, 2])
  len <- ifelse(quoted, cl[, 1], cl[, 2])
  values <- substring(text, start, start + len - 1)
  values[quoted] <- gsub("\"\"", "\"", values[quoted], fixed = TRUE)
  Encoding(values) <- "UTF-8"
  ends <- substring(text, cs[, 3], cs[, 3]) != ","
  if (!ends[n]) { # "1,2," at the very end: the record ends with an empty field
    values <- c(values, "")
    ends <- c(ends, TRUE)
  }
  record <- cumsum(c(1L, head(ends, -1)))
  list(values = values, record = record)
}

# A power of two near the largest magnitude: x / scale is exact and of order 1, so sums and squares of
# scaled values cannot overflow where the statistic itself is representable.
scale_of <- function(x) {
  m <- max(abs(x))
  if (m == 0) return(1)
  2^min(max(floor(log2(m)), -1074), 1023)
}
# (Not mean(): its second, "refining" pass turns the mean of 1e200, -1e200, 5 into 2.78.)
stable_mean <- function(x) {
  s <- scale_of(x)
  sum(x / s) / length(x) * s
}
stable_sd <- function(x) {
  if (length(x) < 2) return(NA_real_)
  s <- scale_of(x)
  m <- sum(x / s) / length(x)
  sqrt(sum((x / s - m)^2) / (length(x) - 1)) * s
}
stable_median <- function(x) {
  x <- sort(x)
  n <- length(x)
  if (n %% 2 == 1) return(x[(n + 1) / 2])
  a <- x[n / 2]
  b <- x[n / 2 + 1]
  if (is.finite(a + b)) (a + b) / 2 else a / 2 + b / 2
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

emit_progress(0, "reading input")
size <- file.size(opt[["input"]])
if (is.na(size)) die(2, "cannot read the input")
con <- file(opt[["input"]], "rb")
chunks <- list()
read <- 0
next_progress <- 5
repeat {
  chunk <- readBin(con, what = "raw", n = 1048576)
  if (length(chunk) == 0) break
  if (any(chunk == as.raw(0))) die(3, "the input is binary, not CSV")
  chunks[[length(chunks) + 1]] <- chunk
  read <- read + length(chunk)
  percent <- floor(read / max(size, 1) * 50)
  if (percent >= next_progress) {
    emit_progress(percent, "reading input")
    next_progress <- percent + 5
  }
}
close(con)
bytes <- do.call(c, c(list(raw(0)), chunks))
if (length(bytes) >= 3 && identical(bytes[1:3], as.raw(c(0xef, 0xbb, 0xbf)))) bytes <- bytes[-(1:3)]
text <- rawToChar(bytes)
if (!validUTF8(text)) die(3, "the input is not UTF-8 text")
Encoding(text) <- "bytes"
emit_progress(55, "parsing CSV")
parsed <- parse_csv(text)
fields_per_record <- tabulate(parsed$record)
blank <- fields_per_record == 1 & parsed$values[cumsum(fields_per_record)] == ""
kept <- which(!blank)
if (length(kept) == 0) die(3, "the input is empty")
trim <- function(x) trimws(x, whitespace = "[ \t\r\n]")
header <- trim(parsed$values[parsed$record == kept[1]])
if (any(header == "")) die(3, "the first line is not a CSV header")
if (anyDuplicated(header)) die(3, paste("duplicate column name:", header[anyDuplicated(header)]))
body <- kept[-1]
short_or_long <- body[fields_per_record[body] != length(header)]
if (length(short_or_long) > 0) {
  r <- short_or_long[1]
  die(3, sprintf("record %d: %d fields, the header has %d", r, fields_per_record[r], length(header)))
}
nrows <- length(body)
cells <- matrix(trim(parsed$values[parsed$record %in% body]), ncol = length(header), byrow = TRUE)
rm(parsed, text, bytes, chunks)

emit_progress(60, "computing statistics")
NUMBER <- "^[+-]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?$"
NON_FINITE <- "^[+-]?(nan|inf|infinity)$"
columns <- lapply(seq_along(header), function(j) {
  v <- cells[, j]
  missing <- v == "" | toupper(v) == "NA"
  number <- grepl(NUMBER, v, perl = TRUE)
  non_finite_text <- grepl(NON_FINITE, v, ignore.case = TRUE, perl = TRUE)
  x <- as.numeric(v[number])
  list(
    name = header[j],
    x = x[is.finite(x)],
    text = sum(!missing & !number & !non_finite_text),
    non_finite = sum(non_finite_text) + sum(!is.finite(x))
  )
})
numeric <- Filter(function(col) length(col$x) > 0 && col$text == 0, columns)
if (length(numeric) == 0) die(3, "no numeric column")
numeric_names <- vapply(numeric, function(col) col$name, character(1))

fmt <- function(v) if (is.na(v) || !is.finite(v)) "" else format(v, digits = 6)
rows <- vapply(numeric, function(col) {
  x <- col$x
  stats <- list(mean = stable_mean(x), stdev = stable_sd(x), min = min(x), median = stable_median(x), max = max(x))
  notes <- character(0)
  for (s in names(stats)) {
    if (!is.na(stats[[s]]) && !is.finite(stats[[s]])) notes <- c(notes, paste(s, "overflows"))
  }
  if (col$non_finite > 0) notes <- c(notes, sprintf("%d NaN/Infinity values treated as missing", col$non_finite))
  sprintf(
    "<tr><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
    html_escape(col$name), length(x), fmt(stats$mean), fmt(stats$stdev), fmt(stats$min),
    fmt(stats$median), fmt(stats$max), html_escape(paste(notes, collapse = "; "))
  )
}, character(1))

# Small multiples: one panel per numeric column, each binned in BINS equal bins between the column's
# own minimum and maximum (printed under the panel), all on one vertical scale: the percentage of
# the column's values in a bin, from 0 to the tallest bar of any panel.
emit_progress(80, "drawing histograms")
plotted <- head(numeric, MAX_PANELS)
left_out <- numeric_names[-seq_along(plotted)]
percents <- lapply(plotted, function(col) {
  x <- col$x
  s <- scale_of(x)
  lo <- min(x) / s
  span <- max(x) / s - lo
  u <- if (span > 0) (x / s - lo) / span else rep(0.5, length(x))
  bin <- pmin(floor(u * BINS), BINS - 1L) + 1L
  100 * tabulate(bin, nbins = BINS) / length(x)
})
ymax <- max(unlist(percents))
panel_cols <- min(length(plotted), 3L)
panel_rows <- ceiling(length(plotted) / panel_cols)
png_file <- tempfile(fileext = ".png")
png(png_file, width = 320 * panel_cols, height = 240 * panel_rows, type = "cairo")
par(mfrow = c(panel_rows, panel_cols), mar = c(3, 4, 2, 1), mgp = c(2, 0.6, 0))
for (k in seq_along(plotted)) {
  col <- plotted[[k]]
  plot.new()
  plot.window(xlim = c(0, 1), ylim = c(0, ymax))
  edges <- seq(0, 1, length.out = BINS + 1)
  rect(edges[-(BINS + 1)], 0, edges[-1], percents[[k]], col = "grey70", border = "white")
  axis(1, at = c(0, 1), labels = c(format(min(col$x), digits = 4), format(max(col$x), digits = 4)))
  axis(2, las = 1)
  title(main = col$name, ylab = "% of values")
}
invisible(dev.off())
png_bytes <- readBin(png_file, what = "raw", n = file.size(png_file))
unlink(png_file)

title <- if (is.null(params$title)) "Analysis report" else params$title
plotted_names <- html_escape(numeric_names[seq_along(plotted)])
html <- c(
  "<!DOCTYPE html>",
  "<html><head><meta charset=\"utf-8\">",
  sprintf("<title>%s</title>", html_escape(title)),
  "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>",
  "</head><body>",
  sprintf("<h1>%s</h1>", html_escape(title)),
  sprintf("<p>%d rows, %d columns, %d numeric.</p>", nrows, length(header), length(numeric)),
  "<table><thead><tr><th>column</th><th>n</th><th>mean</th><th>stdev</th><th>min</th><th>median</th><th>max</th><th>notes</th></tr></thead><tbody>",
  rows,
  "</tbody></table>",
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
writeLines(html, file.path(opt[["output-dir"]], "report.html"), useBytes = TRUE)
emit_progress(95, "report written")
cat(sprintf(
  "{\"type\":\"result\",\"outputFileName\":\"report.html\",\"metrics\":{\"rows\":%d,\"numericColumns\":%d}}\n",
  nrows, length(numeric)
))
