-- Give leases back. ARGV from 4: the number of leases, then five arguments each (lease id,
-- success '1', '0' or '', retry-after ms, actual tokens, actual cost; '' when absent). A
-- permit given back serves the queue at once; with nobody queued and no grant pending, no
-- queue machinery is touched.
local done, epoch = open_ws(false)
if done then return done end
local out = {st = 'released', ep = epoch, rel = release_many(5, tonumber(ARGV[4]) or 0)}
if needs_pump() then pump() end
return reply(out)
