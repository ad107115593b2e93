-- runs_task_file_key was redundant: the create statement inserts one run per row of `files` it selects by
-- primary key, the only place runs are inserted. It cost an index entry in every non-HOT update of a run
-- (claim, completion, cancel): a quarter of a 100,000-run cancel (docs/architecture.md, "Cancel of a big task").
DROP INDEX "runs_task_file_key";