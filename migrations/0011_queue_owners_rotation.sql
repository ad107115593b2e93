-- Fair share (queue_owners in src/db/schema.ts): `start_pass`, the pass each owner had when it was
-- last served — a newcomer joins where the most recently served owner started, so rows whose owners
-- have nothing due no longer pull it back (existing rows start where they stand) — and `version`,
-- bumped by every statement that makes a run queued, so a claim can drop a row it walked past with
-- nothing queued without racing such a statement.
ALTER TABLE "queue_owners" ADD COLUMN "start_pass" bigint DEFAULT 0 NOT NULL;
--> statement-breakpoint
ALTER TABLE "queue_owners" ADD COLUMN "version" integer DEFAULT 0 NOT NULL;
--> statement-breakpoint
UPDATE "queue_owners" SET "start_pass" = "pass";
