-- Serve a workspace's lanes now (a time-based wake fell due).
local done, epoch = open_ws(false)
if done then return done end
local wake = pump()
local out = {st = 'ok', ep = epoch}
if wake ~= nil then out.wake = wake - NOW end
return reply(out)
