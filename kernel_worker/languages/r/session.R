# An R kernel's baseline, and the reset that puts it back after every request.
#
# Evaluated once, at kernel start, into the worker's tools environment (see runtime.py);
# `capture()` records the baseline after start-up, `reset()` runs after each request: it
# restores what a request may change, then checks that everything matches the baseline.
# A mismatch is an error whose message lists what differs: the pool then retires the
# kernel instead of reusing it.

# evaluate's own, set around every execution the kernel runs
.volatile_options <- "try.outFile"
.locale_categories <- c("LC_COLLATE", "LC_CTYPE", "LC_MONETARY", "LC_NUMERIC", "LC_TIME")

.state <- new.env(parent = emptyenv())

.options_now <- function() {
  current <- options()
  current[setdiff(names(current), .volatile_options)]
}

# connections other than the console's three and the one evaluate captures output with
.extra_connections <- function() {
  numbers <- getAllConnections()
  capturing <- getOption("try.outFile")
  keep <- c(0L, 1L, 2L, if (inherits(capturing, "connection")) as.integer(capturing))
  setdiff(numbers, keep)
}

# the kernel's own entries: IRkernel attaches one around every execution
.search_now <- function() grep("^jupyter:", search(), value = TRUE, invert = TRUE)

.snapshot <- function() {
  list(
    globals = sort(ls(globalenv(), all.names = TRUE)),
    search = .search_now(),
    options = .options_now(),
    wd = getwd(),
    env = as.list(Sys.getenv()),
    devices = as.integer(grDevices::dev.list()),
    connections = .extra_connections(),
    sinks = sink.number(),
    message_sink = sink.number(type = "message"),
    callbacks = getTaskCallbackNames(),
    rng = RNGkind(),
    seed = exists(".Random.seed", envir = globalenv(), inherits = FALSE),
    locale = vapply(.locale_categories, Sys.getlocale, ""),
    umask = as.character(Sys.umask(NA)),
    libpaths = .libPaths(),
    tempfiles = list.files(tempdir(), all.files = TRUE, no.. = TRUE)
  )
}

# A child that outlives the worker by a second at most: when the worker is gone (even
# killed), it kills the kernel's process group (the kernel leads it), itself included.
.watch_worker <- function() {
  fields <- strsplit(readLines("/proc/self/stat", warn = FALSE), " ", fixed = TRUE)[[1L]]
  worker <- as.integer(fields[[4L]])
  group <- Sys.getpid()
  watch <- sprintf("tail --pid=%d -f /dev/null; kill -9 -%d", worker, group)
  parallel::mcparallel(system(watch), detached = TRUE)
  invisible(NULL)
}

capture <- function() {
  if (is.null(.state$watching)) {
    .watch_worker()
    .state$watching <- TRUE
  }
  baseline <- .snapshot()
  .state$baseline <- baseline
  .state$globals <- mget(baseline$globals, envir = globalenv())
  .state$namespaces <- loadedNamespaces()
  invisible(NULL)
}

# Options a namespace set while it was first loaded during a request stay, as the namespace
# does: named after it (`ggplot2.*`, `datatable.*` for data.table).
.options_of_new_namespaces <- function(added) {
  fresh <- setdiff(loadedNamespaces(), .state$namespaces)
  if (!length(fresh) || !length(added)) return(character(0))
  prefixes <- unique(c(fresh, gsub(".", "", fresh, fixed = TRUE)))
  owned <- vapply(added, function(name) {
    any(startsWith(name, paste0(prefixes, ".")) | name %in% prefixes)
  }, logical(1))
  added[owned]
}

.restore_output <- function(baseline) {
  while (sink.number() > baseline$sinks) sink()
  if (sink.number(type = "message") != baseline$message_sink) sink(type = "message")
  for (device in setdiff(as.integer(grDevices::dev.list()), baseline$devices)) {
    grDevices::dev.off(device)
  }
  for (number in .extra_connections()) {
    try(close(getConnection(number)), silent = TRUE)
  }
}

.restore_search <- function(baseline) {
  for (attempt in seq_len(50L)) {
    now <- .search_now()
    if (identical(now, baseline$search)) return(invisible(NULL))
    n <- min(length(now), length(baseline$search))
    differs <- which(now[seq_len(n)] != baseline$search[seq_len(n)])
    name <- now[[if (length(differs)) differs[[1L]] else n + 1L]]
    if (is.na(name) || name %in% c(".GlobalEnv", "package:base")) {
      return(invisible(NULL))  # something was detached: reported by the check
    }
    detach(pos = match(name, search()))
  }
}

.restore_globals <- function() {
  baseline <- .state$baseline
  names <- ls(globalenv(), all.names = TRUE)
  rm(list = setdiff(names, baseline$globals), envir = globalenv())
  for (name in baseline$globals) {
    value <- .state$globals[[name]]
    if (!exists(name, envir = globalenv(), inherits = FALSE) ||
        !identical(get(name, envir = globalenv()), value)) {
      assign(name, value, envir = globalenv())
    }
  }
}

.restore_options <- function(baseline) {
  current <- .options_now()
  added <- setdiff(names(current), names(baseline$options))
  kept <- .options_of_new_namespaces(added)
  if (length(kept)) {
    baseline$options <- c(baseline$options, current[kept])
    .state$baseline <- baseline
  }
  removed <- setdiff(added, kept)
  if (length(removed)) options(stats::setNames(vector("list", length(removed)), removed))
  options(baseline$options)
  .state$namespaces <- loadedNamespaces()
}

.restore_environment <- function(baseline) {
  now <- Sys.getenv()
  extra <- setdiff(names(now), names(baseline$env))
  if (length(extra)) Sys.unsetenv(extra)
  changed <- names(baseline$env)[vapply(names(baseline$env), function(name) {
    !identical(Sys.getenv(name, unset = NA), baseline$env[[name]])
  }, logical(1))]
  if (length(changed)) do.call(Sys.setenv, baseline$env[changed])
  setwd(baseline$wd)
  for (category in names(baseline$locale)) {
    if (!identical(Sys.getlocale(category), baseline$locale[[category]])) {
      Sys.setlocale(category, baseline$locale[[category]])
    }
  }
  Sys.umask(baseline$umask)
  .libPaths(baseline$libpaths)
}

.restore_session <- function(baseline) {
  for (name in setdiff(getTaskCallbackNames(), baseline$callbacks)) removeTaskCallback(name)
  do.call(RNGkind, as.list(baseline$rng))
  if (!baseline$seed && exists(".Random.seed", envir = globalenv(), inherits = FALSE)) {
    rm(".Random.seed", envir = globalenv())
  }
  made <- setdiff(list.files(tempdir(), all.files = TRUE, no.. = TRUE), baseline$tempfiles)
  unlink(file.path(tempdir(), made), recursive = TRUE, force = TRUE)
}

# What differs from the baseline, one phrase each.
.differences <- function(baseline, classes) {
  now <- .snapshot()
  problems <- character(0)
  for (key in names(baseline)) {
    if (!identical(now[[key]], baseline[[key]])) {
      problems <- c(problems, sprintf("%s differs from the baseline", key))
    }
  }
  if (classes) problems <- c(problems, "S4 classes or methods were defined")
  problems
}

reset <- function() {
  baseline <- .state$baseline
  # S4 definitions also live in the methods package's tables: no reset can take them back
  classes <- any(grepl("^\\.__[CT]__", ls(globalenv(), all.names = TRUE)))
  .restore_output(baseline)
  .restore_search(baseline)
  .restore_globals()
  .restore_options(baseline)
  .restore_environment(baseline)
  .restore_session(baseline)
  problems <- .differences(.state$baseline, classes)
  if (length(problems)) stop(paste(problems, collapse = "; "), call. = FALSE)
  invisible(NULL)
}
