-- Fair share (queue_owners in src/db/schema.ts): `version`, bumped by every statement that makes a
-- run queued, so a claim can drop a row it walked past with nothing queued without racing such a
-- statement. A constant default: no rewrite.
ALTER TABLE "queue_owners" ADD COLUMN "version" bigint DEFAULT 0 NOT NULL;
