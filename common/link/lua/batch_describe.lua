-- batch_describe.lua: write an OpenAI batch's description again into its job's record, only while
-- the record exists (common/bulk/batch_store.py): its cancel time, its final counts. HSET on a
-- record that expired would make it anew without a TTL.
--
-- KEYS[1]  the job record, funnel:job:{<id>}
-- ARGV[1]  the record's field for it (common/bulk/jobs.py's BATCH_FIELD)
-- ARGV[2]  the description, msgpack
-- Returns  1 when written, 0 when the job is gone
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
