/* chanq.h -- the channel as the daemon uses it: one include for the channel-level API, whose
 * calls carry channel names and delivery handles, never a part (sub-MPSC) of a channel.
 *   chanq_keeper.h  the keeper: views, reclaim, release watch, the consumers' jobs (one per MQ client)
 *   chanq_cons.h    a channel consumer: open, adoption of departed consumers' backlog,
 *                   deliveries with their durable counts, ack, attempt records
 */
#ifndef FX_BRIDGE_CHANQ_H
#define FX_BRIDGE_CHANQ_H

#include "chanq_keeper.h"
#include "chanq_cons.h"
/* chanq_prod.h: the producer side (pipelined submit) */

#endif
