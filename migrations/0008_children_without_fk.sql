ALTER TABLE "runs" DROP CONSTRAINT "runs_task_id_tasks_id_fk";
--> statement-breakpoint
ALTER TABLE "task_events" DROP CONSTRAINT "task_events_task_id_tasks_id_fk";
--> statement-breakpoint
-- Hand-edited: the foreign keys' ON DELETE CASCADE, as one set-based trigger per statement (runs and
-- events are inserted only together with, or under the lock of, their task; see src/db/schema.ts).
-- PL/pgSQL keeps the two DELETEs' plans per session, made for the first call's transition table:
-- retention deletes at most 20 tasks per statement, so every call is of one size. TRUNCATE fires no
-- DELETE trigger: truncate tasks, runs and task_events together.
CREATE FUNCTION assay_task_delete_children() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM task_events e USING deleted_tasks d WHERE e.task_id = d.id;
  DELETE FROM runs r USING deleted_tasks d WHERE r.task_id = d.id;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER tasks_delete_children AFTER DELETE ON tasks
  REFERENCING OLD TABLE AS deleted_tasks
  FOR EACH STATEMENT EXECUTE FUNCTION assay_task_delete_children();
