-- State guards: the database refuses any status value or move that src/tasks/states.ts does not allow.
-- test/integration/states.test.ts walks every pair of states against these triggers and the TS tables.
ALTER TABLE "runs" ADD CONSTRAINT "runs_status_check" CHECK ("status" in
  ('queued', 'starting', 'running', 'cancelling', 'succeeded', 'failed', 'timed_out', 'cancelled'));
--> statement-breakpoint
ALTER TABLE "tasks" ADD CONSTRAINT "tasks_status_check" CHECK ("status" in
  ('queued', 'running', 'cancelling', 'succeeded', 'partially_succeeded', 'failed', 'timed_out', 'cancelled'));
--> statement-breakpoint
CREATE FUNCTION assay_run_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
       (OLD.status = 'queued'     AND NEW.status IN ('starting', 'cancelled', 'failed'))
    OR (OLD.status = 'starting'   AND NEW.status IN ('running', 'queued', 'cancelling', 'succeeded', 'failed', 'timed_out'))
    OR (OLD.status = 'running'    AND NEW.status IN ('queued', 'cancelling', 'succeeded', 'failed', 'timed_out'))
    OR (OLD.status = 'cancelling' AND NEW.status IN ('cancelled', 'succeeded', 'failed', 'timed_out'))
  ) THEN
    RAISE EXCEPTION 'run %: status % -> % is not allowed', OLD.id, OLD.status, NEW.status
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END $$;
--> statement-breakpoint
CREATE TRIGGER runs_transition_guard BEFORE UPDATE OF status ON "runs"
  FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status) EXECUTE FUNCTION assay_run_transition_guard();
--> statement-breakpoint
CREATE FUNCTION assay_task_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
       (OLD.status = 'queued'     AND NEW.status IN ('running', 'cancelling', 'succeeded', 'partially_succeeded', 'failed', 'timed_out', 'cancelled'))
    OR (OLD.status = 'running'    AND NEW.status IN ('cancelling', 'succeeded', 'partially_succeeded', 'failed', 'timed_out', 'cancelled'))
    OR (OLD.status = 'cancelling' AND NEW.status IN ('cancelled'))
  ) THEN
    RAISE EXCEPTION 'task %: status % -> % is not allowed', OLD.id, OLD.status, NEW.status
      USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END $$;
--> statement-breakpoint
CREATE TRIGGER tasks_transition_guard BEFORE UPDATE OF status ON "tasks"
  FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status) EXECUTE FUNCTION assay_task_transition_guard();
