-- Give leases back. ARGV from 4: the number of leases, then four arguments each (lease id, its
-- principal and provider, its outcome: see release_many). A permit given back serves the queue
-- at once; with nobody queued and no grant pending, no queue machinery is touched.
local done, epoch = open_ws(false)
if done then return done end
local out = {st = 'released', ep = epoch, rel = release_many(5, tonumber(ARGV[4]) or 0)}
if needs_pump() then pump() end
return reply(out)
