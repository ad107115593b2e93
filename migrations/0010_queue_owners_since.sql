-- At the same pass the claim takes the owner that reached it first (queue_owners.since in
-- src/db/schema.ts); existing rows count as having reached it now. A non-volatile default: no rewrite.
ALTER TABLE "queue_owners" ADD COLUMN "since" timestamp with time zone DEFAULT now() NOT NULL;