-- A newcomer to the fair-share rotation goes before the owners already served at its pass (see
-- queue_owners.fresh in src/db/schema.ts). Existing rows count as served.
ALTER TABLE "queue_owners" ADD COLUMN "fresh" boolean DEFAULT false NOT NULL;