-- Of the instances $1 (the steps running on a node), those cancelled since
-- they started. The nodes hear of a cancellation on a channel; one that came
-- while a node was not listening (starting, reconnecting) is found here.
SELECT id FROM __S__.instances WHERE id = ANY ($1) AND cancel_requested
