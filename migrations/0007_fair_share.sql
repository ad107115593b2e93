CREATE TABLE "queue_owners" (
	"analysis_type" text NOT NULL,
	"priority" integer NOT NULL,
	"owner_id" bigint NOT NULL,
	"pass" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "queue_owners_analysis_type_priority_owner_id_pk" PRIMARY KEY("analysis_type","priority","owner_id")
);
--> statement-breakpoint
-- Hand-edited: every claim updates the passes it serves; room on each page keeps those updates HOT.
ALTER TABLE "queue_owners" SET (fillfactor = 30);
--> statement-breakpoint
DROP INDEX "runs_claim_idx";--> statement-breakpoint
ALTER TABLE "runs" ALTER COLUMN "priority" SET DEFAULT 5;--> statement-breakpoint
-- Hand-edited: existing runs take their task's owner before the column becomes NOT NULL, and every
-- run moves to the new default priority (5; nothing set another before).
ALTER TABLE "runs" ADD COLUMN "owner_id" bigint;--> statement-breakpoint
UPDATE "runs" r SET "owner_id" = t."owner_id", "priority" = 5 FROM "tasks" t WHERE t."id" = r."task_id";--> statement-breakpoint
ALTER TABLE "runs" ALTER COLUMN "owner_id" SET NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "turn" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "tasks" ADD COLUMN "priority" integer DEFAULT 5 NOT NULL;--> statement-breakpoint
CREATE INDEX "runs_owner_live_idx" ON "runs" USING btree ("owner_id","task_id") WHERE "runs"."status" in ('starting', 'running', 'cancelling');--> statement-breakpoint
CREATE INDEX "runs_claim_idx" ON "runs" USING btree ("analysis_type","owner_id","priority","turn","id") WHERE "runs"."status" = 'queued';--> statement-breakpoint
ALTER TABLE "tasks" ADD CONSTRAINT "tasks_priority_range" CHECK ("tasks"."priority" between 0 and 9);--> statement-breakpoint
-- Hand-edited: owners with queued runs join the fair-share table (their runs keep id order: turn 0).
INSERT INTO "queue_owners" ("analysis_type", "priority", "owner_id")
  SELECT DISTINCT "analysis_type", "priority", "owner_id" FROM "runs" WHERE "status" = 'queued';
