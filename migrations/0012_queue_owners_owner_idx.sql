-- Under a per-user limit a run's end wakes the types in which its owner waits (runWakeOwnersTypes): by
-- owner, across types, which the key (analysis_type, priority, owner_id) does not serve.
CREATE INDEX "queue_owners_owner_idx" ON "queue_owners" USING btree ("owner_id");