#!/usr/bin/env Rscript
# r-report: an HTML report with a table of summary statistics per numeric column and a histogram of
# the first numeric column, embedded as a PNG data URI -> report.html. Base R only.
# Protocol: JSON Lines on stdout (progress, one result); exit 2 bad parameters, 3 unusable data.

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
# The only parameter is an optional title: {} or {"title": "..."}; anything else is exit 2.
parse_params <- function(raw) {
  raw <- trimws(raw)
  if (grepl("^\\{\\s*\\}$", raw)) return(list(title = NULL))
  re <- "^\\{\\s*\"title\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"\\s*\\}$"
  if (!grepl(re, raw, perl = TRUE)) die(2, "parameters must be {} or {\"title\": \"...\"}")
  s <- sub(re, "\\1", raw, perl = TRUE)
  s <- gsub("\\\\u([0-9a-fA-F]{4})", "<U+\\1>", s)
  s <- gsub("\\\\n", "\n", s)
  s <- gsub("\\\\t", "\t", s)
  s <- gsub("\\\\/", "/", s)
  s <- gsub("\\\\\"", "\"", s)
  s <- gsub("\\\\\\\\", "\\\\", s)
  if (nchar(s) == 0 || nchar(s) > 200) die(2, "title must be 1-200 characters")
  list(title = s)
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
text <- rawToChar(do.call(c, c(list(raw(0)), chunks)))
if (!validUTF8(text)) die(3, "the input is not UTF-8 text")
data <- tryCatch(
  read.csv(text = text, check.names = FALSE, stringsAsFactors = FALSE, na.strings = c("", "NA"), strip.white = TRUE),
  error = function(e) die(3, paste("malformed CSV:", conditionMessage(e)))
)
emit_progress(60, "computing statistics")
numeric <- names(data)[vapply(data, function(col) is.numeric(col) && any(!is.na(col)), logical(1))]
if (length(numeric) == 0) die(3, "no numeric column")

rows <- vapply(numeric, function(name) {
  x <- data[[name]]
  x <- x[!is.na(x)]
  fmt <- function(v) if (is.na(v)) "" else format(signif(v, 6))
  sprintf(
    "<tr><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
    html_escape(name), length(x), fmt(mean(x)), fmt(if (length(x) > 1) sd(x) else NA),
    fmt(min(x)), fmt(median(x)), fmt(max(x))
  )
}, character(1))

emit_progress(80, "drawing histogram")
first <- numeric[1]
png_file <- tempfile(fileext = ".png")
png(png_file, width = 640, height = 400, type = "cairo")
hist(data[[first]], main = paste("Histogram of", first), xlab = first, col = "grey80", border = "white")
invisible(dev.off())
png_bytes <- readBin(png_file, what = "raw", n = file.size(png_file))
unlink(png_file)

title <- if (is.null(params$title)) "Analysis report" else params$title
html <- c(
  "<!DOCTYPE html>",
  "<html><head><meta charset=\"utf-8\">",
  sprintf("<title>%s</title>", html_escape(title)),
  "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>",
  "</head><body>",
  sprintf("<h1>%s</h1>", html_escape(title)),
  sprintf("<p>%d rows, %d columns, %d numeric.</p>", nrow(data), ncol(data), length(numeric)),
  "<table><thead><tr><th>column</th><th>n</th><th>mean</th><th>sd</th><th>min</th><th>median</th><th>max</th></tr></thead><tbody>",
  rows,
  "</tbody></table>",
  sprintf("<h2>Histogram of %s</h2>", html_escape(first)),
  sprintf("<img alt=\"histogram\" src=\"data:image/png;base64,%s\">", base64(png_bytes)),
  "</body></html>"
)
writeLines(html, file.path(opt[["output-dir"]], "report.html"), useBytes = TRUE)
emit_progress(95, "report written")
cat(sprintf(
  "{\"type\":\"result\",\"outputFileName\":\"report.html\",\"metrics\":{\"rows\":%d,\"numericColumns\":%d}}\n",
  nrow(data), length(numeric)
))
