-- Fair share: the pass each owner had when it was last served (queue_owners.start_pass in
-- src/db/schema.ts); a newcomer joins where the most recently served owner started, so rows whose
-- owners have nothing due no longer pull it back. Existing rows start where they stand.
ALTER TABLE "queue_owners" ADD COLUMN "start_pass" bigint DEFAULT 0 NOT NULL;
--> statement-breakpoint
UPDATE "queue_owners" SET "start_pass" = "pass";
