-- in_flight.lua: a snippet, not a script. common/link/lua_scripts.py prepends it to the scripts that
-- answer a worker's taken messages (reply.lua, store_results.lua).
--
-- taken_message(list, handle, size, forget): the message a handle names in a worker's in-flight list,
-- as it lies there, or nil when it is no longer in flight; with forget, removed from the list too.
-- A handle (common/contracts/wire.py, `handle`) is the whole message (size is then its length), or,
-- for a long one whose job id lies in its first bytes, those bytes, so that a worker answering
-- images does not send their pixels back to Redis.
-- The take script pushes messages at the list's head, so a batch's own lie at its tail: the search
-- for a long one starts there, and copies each message it compares.
--   list    the in-flight list, funnel:inflight:{<model>}:<worker>
--   handle  the message, or its first bytes
--   size    the message's length in bytes
--   forget  true to remove it (a reply), false to only find it (a bulk item's store)
local function taken_message(list, handle, size, forget)
  size = tonumber(size)
  if size == #handle then
    if forget then return redis.call('LREM', list, -1, handle) > 0 and handle or nil end
    return redis.call('LPOS', list, handle, 'RANK', -1) and handle or nil
  end
  for i = -1, -redis.call('LLEN', list), -1 do
    local message = redis.call('LINDEX', list, i)
    if message and #message == size and string.sub(message, 1, #handle) == handle then
      if forget then redis.call('LREM', list, -1, message) end
      return message
    end
  end
  return nil
end

