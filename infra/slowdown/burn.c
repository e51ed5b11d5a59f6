/* A Mosquitto 2.0 plugin that makes the broker costlier per message by a known amount.
 *
 * On every PUBLISH the broker receives (MOSQ_EVT_MESSAGE) it spins for `burn_us`
 * microseconds of its own thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so each message
 * costs the broker exactly that much more CPU, however fast the machine runs that second:
 * broker CPU-seconds per 10,000 messages rise by 10,000 x burn_us / 1e6.
 *
 *   plugin /path/burn.so
 *   plugin_opt_burn_us 40
 *
 * Built by infra/slowdown/slowdown.py with the headers of Debian's mosquitto-dev. For
 * tests and benchmarks of perfpipe's detector only: never load it into a real broker.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

static mosquitto_plugin_id_t *plugin_id = NULL;
static long burn_ns = 0;

static long elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
}

static int on_message(int event, void *event_data, void *userdata)
{
    struct timespec start, now;
    (void)event; (void)event_data; (void)userdata;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while (elapsed_ns(&start, &now) < burn_ns);
    return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
    (void)supported_version_count; (void)supported_versions;
    return 5;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **user_data,
                          struct mosquitto_opt *opts, int opt_count)
{
    (void)user_data;
    plugin_id = identifier;
    for (int i = 0; i < opt_count; i++) {
        if (strcmp(opts[i].key, "burn_us") == 0) {
            burn_ns = atol(opts[i].value) * 1000L;
        }
    }
    return mosquitto_callback_register(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
}

int mosquitto_plugin_cleanup(void *user_data, struct mosquitto_opt *opts, int opt_count)
{
    (void)user_data; (void)opts; (void)opt_count;
    return mosquitto_callback_unregister(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL);
}
