-- release.lua: a request of a key with a cap on its requests under way is over (web/pipeline.py):
-- its token leaves the key's set (common/link/lua/push.lua added it), so another may start.
--
-- KEYS[1]  the key's requests under way on the model, funnel:running:{<model>}:<owner>
-- ARGV[1]  the request's token
-- Returns  1 if the token was there, else 0 (past its deadline, push.lua trimmed it already)
return redis.call('ZREM', KEYS[1], ARGV[1])
