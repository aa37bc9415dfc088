# One R cell: bind its inputs, run it, write its outputs and a report.
#
# Evaluated once, at kernel start, into the worker's tools environment (see runtime.py).
# The worker runs `run("<plan file>")`: the plan (JSON, written by the worker) holds the
# cell's source and everything else as data; nothing of the request is ever R source.
# Output goes to the kernel's streams as the cell runs; plots to a PNG device; outputs to
# files; what happened to the report file (JSON), which the worker reads.

.frame_format <- "skw.r-frame.v1"
.plot_width <- 800L
.plot_height <- 600L

.json <- function(value, path) {
  jsonlite::write_json(value, path, auto_unbox = TRUE, null = "null", na = "null",
                       digits = NA)
}

# -- inputs -----------------------------------------------------------------------------------

.read_column <- function(column, nrow, folder) {
  type <- column$type
  if (type %in% c("string", "factor")) {
    values <- vapply(column$values, function(v) if (is.null(v)) NA_character_ else v, "")
    if (type == "factor") {
      levels <- vapply(column$levels, function(v) v, "")
      return(factor(values, levels = levels))
    }
    return(values)
  }
  path <- file.path(folder, column$file)
  if (type %in% c("integer", "logical")) {
    values <- readBin(path, "integer", n = nrow, size = 4L, endian = "little")
    return(if (type == "logical") as.logical(values) else values)
  }
  values <- readBin(path, "double", n = nrow, size = 8L, endian = "little")
  if (type == "date") return(structure(values, class = "Date"))
  if (type == "datetime") {
    return(structure(values, class = c("POSIXct", "POSIXt"), tzone = column$tz))
  }
  values
}

.read_frame <- function(folder) {
  meta <- jsonlite::read_json(file.path(folder, "frame.json"), simplifyVector = FALSE)
  nrow <- as.integer(meta$nrow)
  columns <- lapply(meta$columns, .read_column, nrow = nrow, folder = folder)
  names(columns) <- vapply(meta$columns, function(column) column$name, "")
  structure(columns, class = "data.frame", row.names = .set_row_names(nrow))
}

.bind_input <- function(input) {
  kind <- input$kind
  if (kind == "json") return(jsonlite::read_json(input$path, simplifyVector = FALSE))
  if (kind == "rds") return(readRDS(input$path))
  if (kind == "path") return(input$path)
  if (kind == "text") {
    size <- file.size(input$path)
    if (!isTRUE(size > 0)) return("")
    text <- readChar(input$path, size, useBytes = TRUE)
    Encoding(text) <- "UTF-8"
    return(text)
  }
  if (kind == "frame") {
    if (!is.null(input$note)) message(input$note)
    return(.read_frame(input$path))
  }
  stop(input$message, call. = FALSE)
}

# -- outputs ----------------------------------------------------------------------------------

.column_of <- function(x, index, folder) {
  binary <- function(values, size) {
    file <- sprintf("%d.bin", index)
    writeBin(values, file.path(folder, file), size = size, endian = "little")
    file
  }
  if (is.factor(x)) {
    return(list(type = "string", values = as.list(as.character(x))))
  }
  if (inherits(x, "Date")) return(list(type = "date", file = binary(as.double(unclass(x)), 8L)))
  if (inherits(x, "POSIXct")) {
    zone <- attr(x, "tzone")
    return(list(type = "datetime", file = binary(as.double(unclass(x)), 8L),
                tz = if (is.null(zone)) "" else zone[[1L]]))
  }
  if (is.logical(x)) return(list(type = "logical", file = binary(as.integer(x), 4L)))
  if (is.integer(x) && !is.object(x)) return(list(type = "integer", file = binary(x, 4L)))
  if (is.double(x)) return(list(type = "double", file = binary(as.double(unclass(x)), 8L)))
  text <- if (is.character(x)) x else vapply(x, function(v) paste(format(v), collapse = " "), "")
  list(type = "string", values = as.list(enc2utf8(text)))
}

.write_frame <- function(value, folder) {
  dir.create(folder)
  value <- as.data.frame(value)  # a tibble's columns, plainly
  columns <- lapply(seq_along(value), function(i) {
    c(list(name = enc2utf8(names(value)[[i]])), .column_of(value[[i]], i - 1L, folder))
  })
  .json(list(format = .frame_format, nrow = nrow(value), columns = columns),
        file.path(folder, "frame.json"))
  preview <- if (nrow(value) > 0L) {
    paste(utils::capture.output(print(utils::head(value, 5L))), collapse = "\n")
  } else {
    "(empty data.frame)"
  }
  list(kind = "frame", folder = basename(folder), rows = nrow(value),
       columns = ncol(value), preview = preview)
}

# Numbers exactly: 15 significant digits where they read back the same, else 17.
.exact <- function(x) {
  if (is.list(x) && !is.object(x)) {
    out <- lapply(x, .exact)
    attributes(out) <- attributes(x)
    return(out)
  }
  if (!is.double(x) || is.object(x) || !is.null(dim(x))) return(x)
  text <- sprintf("%.15g", x)
  redo <- is.finite(x) & as.numeric(text) != x
  text[redo] <- sprintf("%.17g", x[redo])
  text[is.na(x)] <- "null"
  text[is.nan(x)] <- "\"NaN\""
  text[!is.na(x) & x == Inf] <- "\"Inf\""
  text[!is.na(x) & x == -Inf] <- "\"-Inf\""
  if (length(x) == 1L) return(structure(text, class = "json"))
  structure(paste0("[", paste(text, collapse = ","), "]"), class = "json")
}

.write_json_value <- function(value, path) {
  jsonlite::write_json(.exact(value), path, auto_unbox = TRUE, null = "null", na = "null",
                       json_verbatim = TRUE)
  preview <- if (is.atomic(value) && length(value) == 1L) {
    format(value)
  } else if (is.list(value)) {
    sprintf("list of length %d", length(value))
  } else {
    sprintf("%s of length %d", class(value)[[1L]], length(value))
  }
  list(kind = "json", file = basename(path), preview = preview)
}

.write_rds <- function(value, path) {
  saveRDS(value, path)
  list(kind = "rds", file = basename(path),
       preview = sprintf("R-only %s", paste(class(value), collapse = "/")))
}

.plain_name <- function(name) {
  !grepl("[/\\\\]", name) && !(name %in% c("", ".", ".."))
}

.write_output <- function(name, value, plan, index) {
  if (!.plain_name(name)) stop("its name cannot be a file name", call. = FALSE)
  file <- function(ext) file.path(plan$files_dir, paste0(name, ext))
  if (inherits(value, "data.frame")) {
    return(.write_frame(value, file.path(plan$frames_dir, sprintf("%d", index))))
  }
  if (is.atomic(value) && !is.matrix(value) && !is.array(value)) {
    return(.write_json_value(value, file(".json")))
  }
  if (is.list(value) && !is.object(value)) {
    written <- tryCatch(.write_json_value(value, file(".json")), error = function(e) NULL)
    if (!is.null(written)) return(written)
    unlink(file(".json"))
  }
  .write_rds(value, file(".rds"))
}

# New names, names bound to another value, and those the notebook says a cell mutates.
.changed_names <- function(env, before, mutated) {
  names <- ls(envir = env, all.names = FALSE)
  Filter(function(name) {
    if (!(name %in% names(before)) || name %in% mutated) return(TRUE)
    !identical(get(name, envir = env), before[[name]])
  }, names)
}

.write_outputs <- function(env, before, plan) {
  mutated <- vapply(plan$mutation_defines, function(v) v, "")
  variables <- stats::setNames(list(), character(0))
  index <- 0L
  for (name in .changed_names(env, before, mutated)) {
    value <- get(name, envir = env)
    if (is.function(value)) next  # R functions do not leave an R cell
    index <- index + 1L
    variables[[name]] <- tryCatch(
      .write_output(name, value, plan, index),
      error = function(e) list(kind = "error", error = conditionMessage(e),
                               type = paste(class(value), collapse = "/"))
    )
  }
  variables
}

# -- running ----------------------------------------------------------------------------------

.flush <- function() {
  if (exists("flush_console", envir = asNamespace("evaluate"), inherits = FALSE)) {
    evaluate::flush_console()  # the kernel sends what was printed so far
  }
}

.trace_of <- function(error, calls) {
  call <- conditionCall(error)
  if (identical(call, quote(eval(expr, envir = env)))) call <- NULL  # the cell's own line
  head <- if (is.null(call)) {
    sprintf("Error: %s", conditionMessage(error))
  } else {
    sprintf("Error in %s : %s", paste(deparse(call), collapse = " "), conditionMessage(error))
  }
  names <- vapply(calls, function(c) paste(deparse(c[[1L]]), collapse = " "), "")
  if (length(names) > 1L) head <- c(head, paste("Calls:", paste(names, collapse = " -> ")))
  paste(head, collapse = "\n")
}

# A message once, as R prints it (the kernel adds a line end of its own).
.relay_message <- function(m) {
  message(sub("\n$", "", conditionMessage(m)), appendLF = FALSE)
  invokeRestart("muffleMessage")
}

# The calls from the cell's code down to the error, without the handlers' own.
.cell_calls <- function(frames) {
  top <- Position(function(call) identical(call, quote(eval(expr, envir = env))), frames,
                  right = TRUE, nomatch = 0L)
  calls <- frames[seq_along(frames) > top]
  ours <- vapply(calls, function(call) {
    is.call(call) && deparse(call[[1L]])[[1L]] %in% c(".handleSimpleError", "h")
  }, logical(1))
  calls[!ours]
}

# Evaluate each top-level expression in `env`, printing visible values as a console does.
.evaluate <- function(source, env) {
  calls <- list()
  failure <- tryCatch(
    withCallingHandlers({
      for (expr in parse(text = source, keep.source = FALSE)) {
        shown <- withVisible(eval(expr, envir = env))
        if (shown$visible) print(shown$value)
        .flush()
      }
      NULL
    }, message = .relay_message, error = function(e) calls <<- .cell_calls(sys.calls())),
    error = function(e) e
  )
  if (is.null(failure)) return(NULL)
  list(error = conditionMessage(failure), traceback = .trace_of(failure, calls))
}

.plots <- function(plan) {
  files <- sort(list.files(plan$files_dir, pattern = "^__rplot[0-9]+\\.png$"))
  shown <- character(0)
  for (file in files) {
    path <- file.path(plan$files_dir, file)
    if (isTRUE(file.size(path) > 0)) {
      target <- sprintf("__display__%d.png", length(shown))
      file.rename(path, file.path(plan$files_dir, target))
      shown <- c(shown, target)
    } else {
      unlink(path)
    }
  }
  as.list(shown)
}

.bind <- function(plan, env) {
  for (input in plan$inputs) assign(input$name, .bind_input(input), envir = env)
  for (name in names(plan$paths)) assign(name, plan$paths[[name]], envir = env)
}

run <- function(plan_path) {
  plan <- jsonlite::read_json(plan_path, simplifyVector = FALSE)
  if (length(plan$env)) do.call(Sys.setenv, lapply(plan$env, as.character))
  setwd(plan$work_dir)
  env <- new.env(parent = globalenv())
  report <- list(success = FALSE, variables = stats::setNames(list(), character(0)),
                 displays = list(), error = NULL, traceback = NULL)
  bound <- tryCatch({ .bind(plan, env); NULL }, error = function(e) conditionMessage(e))
  if (!is.null(bound)) {
    message(bound)
    report$error <- bound
    report$traceback <- bound
    .json(report, plan$report_path)
    return(invisible(NULL))
  }
  before <- mget(ls(envir = env), envir = env)
  grDevices::png(file.path(plan$files_dir, "__rplot%03d.png"), width = .plot_width,
                 height = .plot_height, res = 96L)
  device <- grDevices::dev.cur()
  failure <- tryCatch(.evaluate(plan$source, env), finally = {
    if (device %in% grDevices::dev.list()) grDevices::dev.off(device)
  })
  report$displays <- .plots(plan)
  if (is.null(failure)) {
    report$success <- TRUE
    report$variables <- .write_outputs(env, before, plan)
  } else {
    report$error <- failure$error
    report$traceback <- failure$traceback
  }
  .json(report, plan$report_path)
  invisible(NULL)
}
