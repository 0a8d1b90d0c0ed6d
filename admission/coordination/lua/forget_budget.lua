-- Forget exactly one invocation's budgets and repeat counts. ARGV from 4: budget id.
local done, epoch = open_ws(false)
if done then return done end
redis.call('DEL', BASE .. 'b:' .. ARGV[4], BASE .. 'r:' .. ARGV[4])
return reply({st = 'ok', ep = epoch})
